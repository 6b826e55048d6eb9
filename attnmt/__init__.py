"""attnmt: train, decode, score and look inside attention-based neural machine translation models.

Importing the package is cheap and quiet: the heavy libraries (torch, datasets, sentencepiece) are
imported by the stages that need them.
"""

__version__ = "0.1.0"
