"""Device facts (cuda-python / torch / specs) and the occupancy rules."""
import pytest
import torch

from verify_attn import device as vd

H200, PRO6000 = vd.spec("sm_90a"), vd.spec("sm_120a")


@pytest.mark.parametrize("props,threads,regs,smem,want", [
    # MLA default tile, 4 warps, ptxas ~200 regs, 95.5 KB: registers and smem both allow 2 on sm_90 ...
    (H200, 128, 200, 95488, 2),
    # ... but sm_120's 100 KB per SM holds one such block
    (PRO6000, 128, 200, 95488, 1),
    # 8 warps at 255 regs: 8192 regs per warp -> 2 warps per sub-partition -> 8 warps -> 1 block
    (H200, 256, 255, 0, 1),
    # tiny block: the 32-blocks-per-SM limit binds
    (H200, 32, 16, 0, 32),
    # threads bind on sm_120 (1536 per SM): 512-thread blocks with few registers -> 3
    (PRO6000, 512, 32, 1024, 3),
    # cannot launch: smem over the per-block limit, or more than 255 registers
    (PRO6000, 128, 128, 101377, 0),
    (H200, 128, 256, 0, 0),
])
def test_ctas_per_sm(props, threads, regs, smem, want):
    assert vd.ctas_per_sm(props, threads=threads, regs_per_thread=regs, smem_bytes=smem) == want


def test_ctas_per_sm_rejects_nonsense():
    with pytest.raises(ValueError, match="threads"):
        vd.ctas_per_sm(H200, threads=0, regs_per_thread=32, smem_bytes=0)


def test_specs_and_aliases():
    assert vd.spec("sm_120") is PRO6000 and PRO6000.sm_count == 188 and PRO6000.smem_per_block == 99 * 1024
    assert H200.sm_count == 132 and H200.smem_per_block == 227 * 1024
    with pytest.raises(ValueError, match="no device spec"):
        vd.spec("sm_70")
    assert vd.arch_name(9, 0) == "sm_90a" and vd.arch_name(12, 0) == "sm_120a" and vd.arch_name(8, 9) == "sm_89"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU paths")
def test_without_a_gpu():
    assert vd.props_for("cpu") is H200 and vd.sm_count(torch.device("cpu")) == 132
    with pytest.raises(RuntimeError, match="no CUDA device"):
        vd.query(0)
    assert vd._from_cuda_python(0) is None  # cuda-python is installed; the driver call fails cleanly


@pytest.mark.gpu
def test_query_agrees_with_torch():
    p = vd.query(0)
    t = torch.cuda.get_device_properties(0)
    assert p.source == "cuda-python"
    assert p.sm_count == t.multi_processor_count and p.name == torch.cuda.get_device_name(0)
    assert p.arch == vd.arch_name(t.major, t.minor)
