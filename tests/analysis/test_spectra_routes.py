"""spectra without torch (numpy route), the torch device route on the CPU, bfloat16 read as raw
bits, and the idle-core thread default: each against an independent reference."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from headrank.analysis.scan import analyze, layer_metrics
from headrank.core.linalg import factor_roots, metrics_from_roots
from headrank.errors import HeadRankError
from headrank.io.layouts import HeadWeights
from headrank.util.bf16 import mark, to_float32
from headrank.util.threads import IdleCores, cgroup_cpus, computing, default_threads, resolve_device


def _factors(seed=0, n=6, d=48, dh=8):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(n, d, dh, generator=g, dtype=torch.float64), torch.randn(n, d, dh, generator=g,
                                                                                  dtype=torch.float64)
    A[1, :, -1] = A[1, :, 0] * (1 + 1e-9)  # nearly rank-deficient: the QR fallback
    B[2] *= 1e-3
    return A, B


def _dense_sv(A, B):
    return np.stack([np.linalg.svd(a @ b.T, compute_uv=False)[: a.shape[1]] for a, b in zip(A, B, strict=True)])


def test_numpy_route_and_torch_route_on_cpu_match_the_dense_svd():
    """The default (numpy) route and the device route (torch float64, device="cpu") give the
    singular values of the formed d × d product to 1e-13 σ₁, and each other's to 1e-14 σ₁."""
    A, B = _factors()
    An, Bn = A.numpy(), B.numpy()
    dense = _dense_sv(An, Bn)
    m_np = metrics_from_roots(*factor_roots(An, Bn), 1e-3)
    with computing(device="cpu"):
        m_dev = metrics_from_roots(*factor_roots(An, Bn), 1e-3)
    assert isinstance(m_np.sv, np.ndarray) and isinstance(m_dev.sv, np.ndarray)
    s1 = dense[:, :1]
    assert np.abs(m_np.sv - dense).max(initial=0) <= 1e-13 * s1.max()
    assert (np.abs(m_np.sv - dense) <= 1e-13 * s1).all()
    assert (np.abs(m_dev.sv - dense) <= 1e-13 * s1).all()
    assert (np.abs(m_np.sv - m_dev.sv) <= 1e-14 * s1).all()
    for k in ("rank", "k90", "k99"):
        assert (np.asarray(m_np.values[k]) == np.asarray(m_dev.values[k])).all(), k
    # torch inputs through the numpy route come back as torch, with the same numbers
    m_t = metrics_from_roots(*factor_roots(A, B), 1e-3)
    assert isinstance(m_t.sv, torch.Tensor) and np.array_equal(m_t.sv.numpy(), m_np.sv)


def test_nonfinite_heads_are_nan_on_both_routes():
    A, B = _factors(seed=1)
    A[3, 5, 2] = float("nan")
    for device in (None, "cpu"):
        with computing(device=device):
            m = metrics_from_roots(*factor_roots(A.numpy(), B.numpy()), 1e-3)
        assert not m.finite[3] and m.finite[[0, 1, 2, 4, 5]].all()
        assert np.isnan(m.sv[3]).all() and np.isnan(m.values["effective_rank"][3])


def test_results_are_bit_identical_for_any_thread_count():
    A, B = _factors(seed=2, n=40, d=64, dh=16)
    ref = metrics_from_roots(*factor_roots(A.numpy(), B.numpy()), 1e-3)
    for threads in (2, 3, 5):
        with computing(threads=threads):
            m = metrics_from_roots(*factor_roots(A.numpy(), B.numpy()), 1e-3)
        assert np.array_equal(m.sv, ref.sv)
        assert all(np.array_equal(m.values[k], ref.values[k], equal_nan=True) for k in ref.values)


def test_bf16_bits_convert_exactly_like_torch():
    """Every bfloat16 pattern (NaN, ±Inf, subnormals, ±0 included) gives torch's own float32 value."""
    bits = np.arange(2**16, dtype=np.uint16)
    ours = to_float32(mark(bits))
    theirs = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def _write_llama(path, n_layers=2, d=64, heads=4, kv=2, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    dh = d // heads
    sd = {}
    for i in range(n_layers):
        p = f"model.layers.{i}.self_attn."
        sd[p + "q_proj.weight"] = torch.randn(heads * dh, d, generator=g).to(dtype)
        sd[p + "k_proj.weight"] = torch.randn(kv * dh, d, generator=g).to(dtype)
        sd[p + "v_proj.weight"] = torch.randn(kv * dh, d, generator=g).to(dtype)
        sd[p + "o_proj.weight"] = torch.randn(d, heads * dh, generator=g).to(dtype)
    path.mkdir()
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": d, "num_attention_heads": heads, "num_key_value_heads": kv,
        "num_hidden_layers": n_layers, "intermediate_size": 4 * d, "vocab_size": 10, "rope_theta": 10000.0}))
    return sd


def test_bf16_checkpoint_through_numpy_equals_the_dense_float64_products(tmp_path):
    """A bfloat16 llama checkpoint (grouped-query), read without torch: every head's QK and OV
    singular values against the dense float64 SVD of the products formed from torch's own read."""
    sd = _write_llama(tmp_path / "m")
    r = analyze(tmp_path / "m", threads=1, precision="float64")  # auto: tests/core/test_precision.py
    assert r.meta["compute"]["device"] == "cpu" and r.meta["dtype_read"] == ["bfloat16"]
    dh, group = 16, 2
    for i in range(2):
        p = f"model.layers.{i}.self_attn."
        q, k, v, o = (sd[p + n + "_proj.weight"].double().numpy() for n in "qkvo")
        for h in range(4):
            kv = h // group
            qk = k[kv * dh:(kv + 1) * dh].T @ q[h * dh:(h + 1) * dh]
            ov = o[:, h * dh:(h + 1) * dh] @ v[kv * dh:(kv + 1) * dh]
            for prod, m in (("qk", qk), ("ov", ov)):
                want = np.linalg.svd(m, compute_uv=False)[:dh]
                assert np.abs(r.sv[prod][i, h] - want).max() <= 1e-13 * want[0], (i, h, prod)
    again = analyze(tmp_path / "m", threads=3, precision="float64")
    assert again.table.equals(r.table)  # any thread count: the same bits
    assert again.meta["compute"]["threads"] == [3, 3]


def test_spectra_of_a_safetensors_checkpoint_imports_no_torch(tmp_path):
    _write_llama(tmp_path / "m", n_layers=1)
    code = ("import sys; from headrank.analysis.scan import analyze; "
            f"r = analyze({str(tmp_path / 'm')!r}, device='cpu'); r.save({str(tmp_path / 'out')!r}, plots=False); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_device_route_of_a_layer_matches_the_numpy_route():
    g = torch.Generator().manual_seed(4)
    H, Hkv, dh, d = 4, 2, 8, 40
    hw = HeadWeights(wq=torch.randn(H, dh, d, generator=g).numpy(), wk=torch.randn(Hkv, dh, d, generator=g).numpy(),
                     wv=torch.randn(Hkv, dh, d, generator=g).numpy(), p=torch.randn(H, d, dh, generator=g).numpy())
    m_np, n_np = layer_metrics(hw)
    hw2 = HeadWeights(hw.wq, hw.wk, hw.wv, hw.p)  # its roots formed afresh on the device route
    with computing(device="cpu"):
        m_dev, n_dev = layer_metrics(hw2)
    for prod in ("qk", "ov"):
        s1 = m_np[prod].sv[:, :1]
        assert (np.abs(m_np[prod].sv - m_dev[prod].sv) <= 1e-14 * s1).all()
    for k in n_np:
        assert np.allclose(n_np[k], np.asarray(n_dev[k]), rtol=1e-13, atol=0)


def test_default_threads_are_the_idle_cores(tmp_path):
    assert default_threads(budget=2, load=0.0) == 2
    assert default_threads(budget=2, load=0.4) == 2
    assert default_threads(budget=2, load=0.6) == 1
    assert default_threads(budget=2, load=7.0) == 1
    assert default_threads(budget=16, load=3.2) == 13
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpus(str(tmp_path)) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(str(tmp_path)) is None
    pinned = IdleCores(3)
    assert pinned.threads() == 3 and pinned.threads() == 3
    follow = IdleCores()
    assert 1 <= follow.threads() <= follow.budget


def test_device_choices():
    assert resolve_device("cpu") is None
    for bad in ("gpu", "cuda:x", 3, "CPU"):
        with pytest.raises(HeadRankError, match="`device` must be"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        assert resolve_device("auto") is None
        with pytest.raises(HeadRankError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_read_buffers_are_reused_only_once_nothing_refers_to_them(tmp_path):
    """The streaming reader's buffers (io.stfile.BufferPool): a layer's tensors are never
    overwritten while any view of them lives; once dropped, the next read reuses them."""
    from headrank.io.checkpoint import Checkpoint
    from headrank.io.stfile import BufferPool, reading_into

    sd = _write_llama(tmp_path / "m", n_layers=2, d=512, heads=4, kv=4, dtype=torch.float32)  # 1 MiB tensors
    ck = Checkpoint(tmp_path / "m", arrays="numpy")
    pool = BufferPool()
    name = "model.layers.{}.self_attn.q_proj.weight"
    with reading_into(pool):
        a = ck.get(name.format(0))
        view = a.reshape(4, 128, 512)[1:].transpose(0, 2, 1)  # a view of a view: it alone keeps the buffer
        del a
        b = ck.get(name.format(1))
    assert not np.shares_memory(view, b) and len(pool._bufs) == 2
    np.testing.assert_array_equal(view, sd[name.format(0)].numpy().reshape(4, 128, 512)[1:].transpose(0, 2, 1))
    del view
    with reading_into(pool):
        c = ck.get(name.format(0))
    assert len(pool._bufs) == 2 and any(np.shares_memory(c, buf) for buf in pool._bufs)
    np.testing.assert_array_equal(c, sd[name.format(0)].numpy())
    np.testing.assert_array_equal(b, sd[name.format(1)].numpy())  # still intact
    small = BufferPool(max_bytes=1 << 20)  # holds one buffer; more are fresh and freed with their arrays
    with reading_into(small):
        x, y = ck.get(name.format(0)), ck.get(name.format(1))
    assert len(small._bufs) == 1 and not np.shares_memory(x, y)
    ck.close()


@pytest.mark.slow
def test_cli_figures_are_drawn_in_two_halves_in_order(tmp_path):
    """The figure process shares the figures with a fork of itself: the same files, in the
    order draw_spectra writes them, as drawing in-process."""
    from headrank.analysis import plots
    from headrank.analysis.figproc import FigureProcess, figure_data

    _write_llama(tmp_path / "m", n_layers=2, d=64, heads=4, kv=4)
    res = analyze(tmp_path / "m", threads=1)
    proc = FigureProcess()
    (tmp_path / "child").mkdir()
    assert proc.submit(figure_data(res), tmp_path / "child")
    got = proc.wait()
    want = plots.draw_spectra(figure_data(res), tmp_path / "here")
    assert got is not None and [p.name for p in got] == [p.name for p in want] and len(want) >= 3


def test_a_helper_process_counts_as_the_runs_own_cpu():
    """IdleCores subtracts the CPU of the run's helper processes (the figure process importing
    matplotlib beside the first layers) from other processes' load, as it does its own threads'."""
    from headrank.util.threads import _pid_cpu_s, count_as_own

    burn = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "print('done', flush=True)\nsys.stdin.readline()\n")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"  # it has used 0.3 s of CPU, and now waits
        used = _pid_cpu_s(child.pid)
        assert 0.29 <= used <= 5.0
        before = IdleCores._sample()[2]
        count_as_own(child.pid)
        try:
            assert IdleCores._sample()[2] - before >= used - 0.02
        finally:
            count_as_own(child.pid, False)
        assert IdleCores._sample()[2] - before < used - 0.02
    finally:
        child.stdin.close()
        child.wait()
    assert _pid_cpu_s(child.pid) == 0.0  # gone


def test_the_cli_starts_the_figure_process_before_parsing_only_when_asked(tmp_path):
    """``headrank spectra … --out DIR`` starts its figure process before typer is imported
    (headrank.cli.early); nothing else does, and the command takes the one started."""
    from headrank.analysis import figproc
    from headrank.cli.early import start_figures, wants_figures

    prog = ["/venv/bin/headrank", "spectra", "m"]
    assert wants_figures([*prog, "--out", "o"]) and wants_figures([*prog, "--out=o", "-q"])
    assert wants_figures(["/x/src/headrank/__main__.py", "spectra", "m", "--out", "o"])
    for argv in ([*prog], [*prog, "--out", "o", "--no-plots"], [*prog, "--out", "o", "--help"],
                 ["/venv/bin/headrank", "compress", "m", "--out", "o"], ["/venv/bin/pytest", "spectra", "m", "--out", "o"]):
        assert not wants_figures(argv), argv
    start_figures(["/venv/bin/pytest", "spectra", "m", "--out", "o"])
    assert figproc.take_early() is None
    start_figures([*prog, "--out", "o"])
    proc = figproc.take_early()
    assert proc is not None and proc.proc.poll() is None and figproc.take_early() is None
    proc.close()
    _write_llama(tmp_path / "m", n_layers=1)
    out = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
                          "-q"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"fig4_norms.png", "singular_values.png", "heads.csv"} <= {p.name for p in (tmp_path / "o").iterdir()}


def test_the_first_interval_starts_at_the_commands_start_up(monkeypatch):
    """IdleCores' first re-check covers the time since util.threads was imported when that was
    recent (a command's start-up), not only the first read (too short for 10 ms accounting)."""
    import headrank.util.threads as th

    recent = IdleCores()
    assert recent._mark is th._IMPORTED or recent._mark[0] - th._IMPORTED[0] > IdleCores.FRESH_S
    monkeypatch.setattr(th, "_IMPORTED", (th._IMPORTED[0] - 2 * IdleCores.FRESH_S, *th._IMPORTED[1:]))
    stale = IdleCores()
    assert stale._mark is not th._IMPORTED and stale._mark[0] > th._IMPORTED[0] + IdleCores.FRESH_S
    monkeypatch.setattr(th, "_IMPORTED", (stale._mark[0] - 1.0, *th._IMPORTED[1:]))
    fresh = IdleCores()
    assert fresh._mark is th._IMPORTED
    assert 1 <= fresh.threads() <= fresh.budget and len(fresh.history) == 2  # a 1 s interval: re-measured
