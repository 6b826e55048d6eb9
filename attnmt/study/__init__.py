"""``attnmt study``: a config in, one model per attention variant trained on the same budget, measured
and reported.

``run`` holds the variants, the study folder and each variant's training in a child process;
``measure`` what is measured of each (quality, speed, one sentence's attention); ``growth`` each
kernel's time and memory against length, one measurement per fresh process; ``report`` the report in
Markdown and HTML with its figures.
"""
