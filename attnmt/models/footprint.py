"""What a model needs in memory, checked before it is built: a checkpoint (or an imported config.json) can
describe a model larger than the machine, and building it would fail with the out-of-memory message meant
for batches ("reduce the batch"), the wrong advice. ``ModelSpec``: a model known by its config and
vocabulary sizes alone (``checkpoint.model_spec``, ``attnmt info``).

The model is first built on the meta device (shapes only, nothing allocated); its parameters and buffers
(the sinusoid table holds ``model.max_positions`` x ``d_model`` floats) are summed and compared with the
memory free on the device it goes to: on the CPU, the kernel's ``MemAvailable`` within the cgroup's limit;
on CUDA, ``torch.cuda.mem_get_info``. Too large is a ResourceError (exit 5) naming the checkpoint, the size
and the largest tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import ResourceError, is_out_of_memory


@dataclass
class ModelSpec:
    """A model's config and vocabulary sizes, known without loading weights (``attnmt info``)."""

    cfg: Any
    src_vocab_size: int
    tgt_vocab_size: int
    origin: str  # where the sizes come from


# Names of the tensors whose size a config key sets, for the message.
CONFIG_KEYS = {"positions.table": "model.max_positions"}


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def _cgroup_free() -> int | None:
    """The cgroup (v2) memory limit less what the group uses; None without a limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" or not limit.isdigit() else max(int(limit) - used, 0)


def free_memory(device: str | torch.device = "cpu") -> int | None:
    """Bytes free for a new model on ``device``; None where it is not known (then nothing is refused)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] if torch.cuda.is_available() else None
    if device.type != "cpu":
        return None
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    group = _cgroup_free()
    return group if free is None else free if group is None else min(free, group)


def model_bytes(model: torch.nn.Module) -> tuple[int, str, tuple[int, ...]]:
    """(bytes of the parameters and buffers, the name and shape of the largest tensor): shared weights
    once."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if not tensors:
        return 0, "", ()
    name, largest = max(tensors.items(), key=lambda item: item[1].numel())
    return sum(t.numel() * t.element_size() for t in tensors.values()), name, tuple(largest.shape)


def check_fits(model: torch.nn.Module, where: Path | str, device: str | torch.device = "cpu") -> None:
    """A ResourceError naming ``where`` when ``model`` (built on the meta device) needs more memory than
    ``device`` has free."""
    need, name, shape = model_bytes(model)
    free = free_memory(device)
    if free is None or need <= free:
        return
    key = next((f" ({k} is {shape[0]})" for suffix, k in CONFIG_KEYS.items() if name.endswith(suffix)), "")
    size = " x ".join(map(str, shape))
    raise ResourceError(f"{where}: the model it describes needs {gib(need)} of memory and {device} has "
                        f"{gib(free)} free: its largest tensor, {name}, is {size}{key}; the model is too "
                        "large for this machine, whatever the batch")


# nn.init's fillers and the tensor methods they end in: on the meta device there is nothing to fill.
FILLERS = frozenset({"normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                     "xavier_uniform_", "xavier_normal_", "orthogonal_", "constant_", "ones_", "zeros_",
                     "fill_", "zero_", "eye_", "dirac_", "sparse_"})


class _ShapesOnly(TorchFunctionMode):
    """Inside ``torch.device("meta")``: initialisers leave meta tensors as they are. Filling one does
    nothing anyway, but ``normal_`` gets there through a reference implementation whose first call imports
    torch._dynamo: a second of CPU in every command that loads a model. The mode is this thread's alone."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        filled = args[0] if args else kwargs.get("tensor")  # nn.init hands its tensor on by keyword
        if getattr(func, "__name__", None) in FILLERS and isinstance(filled, torch.Tensor) and filled.is_meta:
            return filled
        return func(*args, **kwargs)


def build_within_memory(build: Callable[[], torch.nn.Module], where: Path | str,
                        device: str | torch.device = "cpu") -> torch.nn.Module:
    """``build()`` on the CPU, after ``check_fits`` on the meta device (for the CPU, and for ``device``
    where the model goes next); running out of memory while building is said of the model too."""
    shapes = fits_in_memory(build, where, device)
    try:
        return build()
    except Exception as e:  # MemoryError, or the CPU allocator's RuntimeError
        if not is_out_of_memory(e):
            raise
        size = f" ({gib(model_bytes(shapes)[0])})" if shapes is not None else ""
        raise ResourceError(f"{where}: out of memory building the model it describes{size}; the model is too "
                            "large for the memory free now, whatever the batch") from None


def fits_in_memory(build: Callable[[], torch.nn.Module], where: Path | str,
                   device: str | torch.device = "cpu") -> torch.nn.Module | None:
    """``check_fits`` of what ``build()`` makes on the meta device, for the CPU and for ``device``; returns
    it. A model its config cannot make (ValueError) is left to the real build to say: None."""
    try:
        with torch.device("meta"), _ShapesOnly():
            shapes = build()
    except ValueError:
        return None
    for target in dict.fromkeys(["cpu", str(device)]):
        check_fits(shapes, where, target)
    return shapes
