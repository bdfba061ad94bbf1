"""Kept output buffers for a prompt step's large tensors (kernels/workspace.py): a buffer is
handed out again only once nothing holds its previous output, so kept buffers change where
outputs live, never their values."""

from __future__ import annotations

import pytest
import torch
from test_decode_stack import generate

from inferpath.kernels import workspace


@pytest.fixture
def small_threshold(monkeypatch):
    """Every tensor of 4 KB or more through the kept buffers, from none kept."""
    monkeypatch.setattr(workspace, "MIN_BYTES", 4096)
    workspace.release()
    yield
    workspace.release()


def test_a_buffer_is_handed_out_again_only_once_its_output_is_dropped(small_threshold):
    a = workspace.empty((64, 32))
    a.fill_(1.0)
    b = workspace.empty((64, 32))  # a is alive: another buffer
    assert a.data_ptr() != b.data_ptr()
    view = a[:, :16]  # a view keeps a's storage held
    del a
    c = workspace.empty((64, 32))
    assert c.data_ptr() not in (view.data_ptr(), b.data_ptr())
    del view, b, c
    d = workspace.empty((32, 32), torch.bfloat16)  # a free buffer large enough serves a smaller output
    assert d.shape == (32, 32) and d.dtype == torch.bfloat16 and d.is_contiguous()
    assert workspace.kept_bytes() <= workspace.KEPT * 64 * 32 * 4


def test_kept_buffers_stay_within_their_count_and_bytes(small_threshold, monkeypatch):
    monkeypatch.setattr(workspace, "MAX_KEPT_BYTES", 64 << 10)
    held = [workspace.empty((1024, 8)) for _ in range(workspace.KEPT + 2)]  # all alive at once: 32 KB each
    assert len({t.data_ptr() for t in held}) == len(held)
    assert workspace.kept_bytes() <= 64 << 10
    del held
    big = workspace.empty((4096, 8))  # 128 KB: past the cap, allocated and not kept
    assert workspace.kept_bytes() <= 64 << 10
    del big


def test_room_is_made_past_a_busy_buffer(small_threshold):
    """A buffer still held, kept before free ones too small for the next output: the free
    ones make room (removed by identity, not by comparing tensors' values)."""
    busy = workspace.empty((16, 64))
    small = [workspace.empty((16, 64 + i)) for i in range(workspace.KEPT - 1)]
    del small  # free, but too small for what comes next
    large = workspace.empty((64, 256))
    assert large.data_ptr() != busy.data_ptr()
    assert len(workspace.kept_buffers()) <= workspace.KEPT
    assert any(b.numel() >= 64 * 256 * 4 for b in workspace.kept_buffers())


def test_threads_share_one_bounded_set_and_never_one_live_buffer(small_threshold):
    """Outputs taken on many threads at once (the engine's steps run on executor threads):
    none is handed out while another thread holds it, and what is kept stays within the
    process's count, however many threads there were."""
    import threading

    errors = []

    def work(value: float) -> None:
        for _ in range(50):
            out = workspace.empty((64, 64))
            out.fill_(value)
            threading.Event().wait(0.0005)
            if not bool((out == value).all()):
                errors.append(value)

    threads = [threading.Thread(target=work, args=(float(i),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"outputs written over by other threads: {errors}"
    assert len(workspace.kept_buffers()) <= workspace.KEPT


def test_small_outputs_are_plain_tensors():
    workspace.release()
    t = workspace.empty((4, 4))
    assert t.shape == (4, 4) and workspace.kept_bytes() == 0


@torch.inference_mode()
def test_a_model_through_kept_buffers_gives_the_same_bits(small_threshold, monkeypatch):
    """SmolLM2's prompts and decode steps with every projection and SwiGLU output of 4 KB or
    more in kept buffers: no output handed out over one still alive, and the same greedy
    tokens and logprobs, to the bit, as with none kept (a kernel leaving a kept buffer's old
    contents in an output would change them)."""
    import weakref

    handed, original = [], workspace.empty

    def checked(shape, dtype=torch.float32):
        out = original(shape, dtype)
        lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        for ref, (a, b) in handed:
            alive = ref()
            assert alive is None or hi <= a or b <= lo, "an output handed out over a live one"
        handed.append((weakref.ref(out), (lo, hi)))
        return out

    monkeypatch.setattr(workspace, "empty", checked)
    kept = generate("smollm2-135m-instruct", False, threads=2)
    assert workspace.kept_bytes() > 0 and len(handed) > 100
    monkeypatch.setattr(workspace, "MIN_BYTES", 1 << 62)
    assert generate("smollm2-135m-instruct", False, threads=2) == kept


@torch.inference_mode()
def test_dequantized_tiles_through_kept_buffers_give_the_same_bits(small_threshold, monkeypatch):
    """The dequantized path's tiles and output (quant_ops.dequantized_linear, several tiles
    spanning two weights) from kept buffers: the bits of plain tensors."""
    from inferpath.kernels import build, quant_ops

    monkeypatch.setattr(quant_ops, "DEQUANT_TILE_VALUES", 64 * 96)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(24, 96, generator=gen)
    weights = [(torch.randn(200, 96, generator=gen), None), (torch.randn(136, 96, generator=gen), None)]
    biases = [torch.randn(200, generator=gen), None]
    kept = quant_ops.dequantized_linear(x, weights, biases, build.native_quant_dequantize())
    assert workspace.kept_bytes() > 0
    for buffer in workspace.kept_buffers():  # free buffers poisoned (NaN bytes): every element must be written
        if workspace._free(buffer):
            buffer.fill_(255)
    again = quant_ops.dequantized_linear(x, weights, biases, build.native_quant_dequantize())  # buffers reused
    monkeypatch.setattr(workspace, "MIN_BYTES", 1 << 62)
    plain = quant_ops.dequantized_linear(x, weights, biases, build.native_quant_dequantize())
    assert torch.equal(kept, plain) and torch.equal(again, plain)
    expected = torch.nn.functional.linear(x, torch.cat([w for w, _ in weights]), torch.cat([biases[0], torch.zeros(136)]))
    torch.testing.assert_close(plain, expected, rtol=1e-5, atol=1e-5)
