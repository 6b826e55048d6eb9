"""The device choice on a machine with and without CUDA (``torch.cuda.is_available`` patched either way, so
both machines are tested everywhere), the one-process ``Dist`` and what torchrun's variables give."""

import pytest
import torch

from attnmt.config.schema import Device
from attnmt.errors import ConfigError
from attnmt.training.distributed import Dist, choose_device, environment_rank, setup_distributed


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.fixture
def with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name", ["cpu", Device.cpu, "auto", Device.auto])
def test_cpu_and_auto_give_the_cpu_without_cuda(no_cuda, name):
    assert choose_device(name) == torch.device("cpu")


@pytest.mark.parametrize("name", ["cpu", Device.cpu])
def test_cpu_gives_the_cpu_even_with_cuda(with_cuda, name):
    assert choose_device(name) == torch.device("cpu")


@pytest.mark.parametrize("name", ["auto", "cuda", Device.auto, Device.cuda])
def test_auto_and_cuda_take_gpu_0_outside_torchrun(with_cuda, name):
    assert choose_device(name) == torch.device("cuda", 0)


@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_under_torchrun_each_process_takes_the_gpu_of_its_local_rank(with_cuda, monkeypatch, name):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert choose_device(name) == torch.device("cuda", 3)


def test_cuda_without_cuda_names_the_config_setting(no_cuda):
    with pytest.raises(ConfigError) as info:
        choose_device("cuda")
    assert str(info.value) == ("train.device: CUDA is not available on this machine; "
                               "use device: cpu or auto")


def test_cuda_without_cuda_names_the_option(no_cuda):
    with pytest.raises(ConfigError) as info:
        choose_device(Device.cuda, "--device")
    assert str(info.value) == "--device: CUDA is not available on this machine; use --device cpu"


def test_an_unknown_device_name_is_refused(no_cuda):
    with pytest.raises(ValueError):
        choose_device("tpu")


def test_dist_is_a_one_process_identity():
    dist = Dist()
    assert (dist.world_size, dist.rank, dist.local_rank) == (1, 0, 0)
    assert dist.device == torch.device("cpu")
    assert dist.main and not dist.active
    values = [1.5, 2.0, 1e17 + 1]
    assert dist.all_sum(values) == [1.5, 2.0, 1e17 + 1]
    assert dist.barrier() is None
    dist.close()  # no process group: nothing to destroy, and no error


def test_dist_main_is_rank_0_and_active_is_more_than_one_process():
    assert not Dist(world_size=2, rank=1, local_rank=1).main
    assert Dist(world_size=2, rank=0).main and Dist(world_size=2, rank=0).active


@pytest.mark.parametrize("world", [None, "1"])
def test_setup_without_torchrun_is_one_process(no_torchrun, monkeypatch, world):
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", world)
    dist = setup_distributed(torch.device("cpu"))
    assert dist == Dist()
    assert not torch.distributed.is_initialized()


def test_environment_rank_reads_rank(no_torchrun, monkeypatch):
    assert environment_rank() == 0
    monkeypatch.setenv("RANK", "5")
    assert environment_rank() == 5
