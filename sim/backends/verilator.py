"""Backend on Verilator: the whole stream run happens in a compiled C++ harness (no per-cycle Python).

For each design, :class:`VerilatorBackend` generates the component's Verilog, a wrapper module
``harness_top`` with plain port names, and a C++ harness specialised to its stream ports
(``harness/stream_harness.cpp``), and builds them once into
``build/verilator/<sha256 of sources and flags>/sim``. Builds happen in a temporary directory that is
renamed into place, so concurrent processes (pytest-xdist) never see a half-built executable. Each run
writes a binary stimulus file, runs the executable and reads back the outputs and the cycle count.
"""

import fcntl
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np

from .base import Backend, StreamRun, SimulationTimeout, stream_ports
from .verilog import verilog_text, module_ports, verilator_env, verilator_bin_dir

__all__ = ["VerilatorBackend", "BUILD_ROOT", "build_executable", "strip_zero_memory_inits", "verilator_flags"]

ROOT = Path(__file__).resolve().parents[2]
#: Where executables are cached; override with the ``VERILATOR_BUILD_DIR`` environment variable.
BUILD_ROOT = Path(os.environ.get("VERILATOR_BUILD_DIR", ROOT / "build" / "verilator"))
HARNESS_TEMPLATE = Path(__file__).resolve().parent / "harness" / "stream_harness.cpp"

# Generated code trips many style warnings (see verilog.LINT_WAIVERS); linting is `verilog.lint`'s job.
# Amaranth declares every register with its init value; `--x-* 0` makes anything else deterministic too.
VERILATOR_FLAGS = ["--cc", "--exe", "-O3", "-Wno-fatal", "-Wno-lint", "-Wno-style",
                   "--x-assign", "0", "--x-initial", "0", "--top-module", "harness_top"]
# C++ optimisation: -O1 on the model builds ~20% faster than -O2 and still runs FPMul at several million
# cycles/s.
# CFG_CXXFLAGS_PCH_I: the wheel's verilated.mk leaves it empty, which breaks models split into several C++ files.
MAKE_FLAGS = ["OPT_FAST=-O1", "OPT_SLOW=-O0", "OPT_GLOBAL=-O2", "USER_CFLAGS=-O1", "CFG_CXXFLAGS_PCH_I=-include"]
# Verilator's run-time library objects: identical for every design built with the flags above, so they are
# compiled once and copied into later builds.
RUNTIME_OBJS = ("verilated.o", "verilated_threads.o")
# Verilator options that leave those objects unchanged, so builds that differ only in them share one compile: the
# optimiser's switches (-f...) and tracing (--trace sets VM_TRACE, which verilated.h turns into the unused
# compatibility macro WAVES). Checked: a traced build's objects and a -fno-dfg build's are byte-identical.
_RUNTIME_NEUTRAL = re.compile(r"-f(no-)?[a-z0-9-]+|--trace(-fst|-vcd|-underscore)?")


def _nwords(width: int) -> int:
    return (width + 31) // 32


def _wrapper(ports, top_ports) -> str:
    """Verilog module ``harness_top``: ``top`` with its stream ports renamed ``inK_*`` / ``outK_*``.

    The design's reset is a register of the wrapper, high until the first clock edge (the harness's reset
    cycle), not a port: Verilator evaluates every piece of combinational logic that depends on a top-level
    input (the "ico" region) twice per cycle, and through the reset that is most of a design's next-state
    logic (measured: the LPDDR5X NDP device 19 % and the fused TINY PIM top 15 % less CPU per cycle)."""
    decl, conn, body = ["input clk"], [], ""
    if "clk" in top_ports:
        conn.append(".clk(clk)")
    if "rst" in top_ports:
        body = "  reg rst = 1'b1;\n  always @(posedge clk) rst <= 1'b0;\n"
        conn.append(".rst(rst)")
    k_in = k_out = 0
    for p in ports:
        if p.direction == "in":
            w, k_in = f"in{k_in}", k_in + 1
            decl += [f"input {w}_valid", f"output {w}_ready"]
            if p.width:
                decl.append(f"input [{p.width - 1}:0] {w}_payload")
        else:
            w, k_out = f"out{k_out}", k_out + 1
            decl += [f"output {w}_valid", f"input {w}_ready"]
            if p.width:
                decl.append(f"output [{p.width - 1}:0] {w}_payload")
        for sig in ("valid", "ready", "payload"):
            if f"{p.name}__{sig}" in top_ports:
                conn.append(f".{p.name}__{sig}({w}_{sig})")
    return ("module harness_top(\n  " + ",\n  ".join(decl) + "\n);\n" + body +
            "  top dut(\n    " + ",\n    ".join(conn) + "\n  );\nendmodule\n")


def _harness(ports) -> str:
    """The C++ harness for ``ports`` (from ``stream_harness.cpp``)."""
    ins = [p for p in ports if p.direction == "in"]
    outs = [p for p in ports if p.direction == "out"]
    read, idle, drive, sample = [], [], [], []
    for k, p in enumerate(ins):
        nw = _nwords(p.width)
        read.append(f"    ins[{k}].read(r, {nw});")
        idle.append(f"    top->in{k}_valid = 0;")
        payload = (f" set_payload(top->in{k}_payload, &p.data[p.pos * {nw}]);" if p.width else "")
        drive.append(f"        {{ InPort& p = ins[{k}];\n"
                     f"          if (!p.presenting && p.pos < p.n && p.pat[t % p.pat.size()]) "
                     f"{{ p.presenting = true;{payload} }}\n"
                     f"          top->in{k}_valid = p.presenting; }}")
        sample.append(f"        if (ins[{k}].presenting && top->in{k}_ready) "
                      f"{{ ins[{k}].presenting = false; ++ins[{k}].pos; }}")
    for k, q in enumerate(outs):
        read.append(f"    outs[{k}].read(r);")
        idle.append(f"    top->out{k}_ready = 0;")
        drive.append(f"        top->out{k}_ready = outs[{k}].pat[t % outs[{k}].pat.size()];")
        store = f" get_payload(top->out{k}_payload, q.data);" if q.width else ""
        sample.append(f"        {{ OutPort& q = outs[{k}];\n"
                      f"          if (top->out{k}_ready && top->out{k}_valid) "
                      f"{{{store} if (++q.seen == q.want + 1) q.extra_cycle = t; }} }}")
    done = " && ".join(f"(outs[{k}].all || outs[{k}].seen >= outs[{k}].want)" for k in range(len(outs))) or "true"
    text = HARNESS_TEMPLATE.read_text()
    for key, value in (("@N_IN@", str(len(ins))), ("@N_OUT@", str(len(outs))), ("@READ@", "\n".join(read)),
                       ("@IDLE@", "\n".join(idle)), ("@DRIVE@", "\n".join(drive)),
                       ("@SAMPLE@", "\n".join(sample)), ("@DONE@", done)):
        text = text.replace(key, value)
    return text


def _run_tool(cmd, cwd, what):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=verilator_env())
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"Verilator build failed: {what} exited with {proc.returncode} in {cwd}:\n{tail}")


def _publish(tmp: Path, final: Path) -> None:
    """Atomically move a finished build directory into place (another process may have won the race)."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


# A memory word initialised to zero (Yosys writes every word of an Amaranth Memory's init, zeros included):
# `    name[123] = 16'h0000;`, only inside an `initial begin ... end` block.
_ZERO_WORD = re.compile(r"^\s*[A-Za-z_\\][^\s\[]*\[\d+\] = \d+'[hbd]0+;$")


def strip_zero_memory_inits(verilog: str) -> str:
    """``verilog`` without the memory-word initialisations to zero in its ``initial`` blocks. Under
    ``--x-initial 0`` (VERILATOR_FLAGS) every variable starts at zero anyway, so the model is the same; a rank
    PU's 128K-entry rank buffer no longer becomes 128K C++ statements (PAPER: 139K of the 223K lines of the fast
    build's Verilog)."""
    out, in_initial = [], False
    for line in verilog.split("\n"):
        st = line.strip()
        if in_initial:
            if st == "end":
                in_initial = False
            elif _ZERO_WORD.match(line):
                continue
        elif st == "initial begin":
            in_initial = True
        out.append(line)
    return "\n".join(out)


# Yosys's internal wires: escaped names that start with `$` (`\$12`, `\$auto$verilog_backend.cc:2355:...$17`),
# Verilog for the wires of intermediate expressions. Not preceded by an identifier character or a backslash, so
# a `$` inside a name (`\rport__en$173`) is not one.
_INTERNAL_WIRE = re.compile(r"(?<![\w$\\])\\\$")
TRACE_FLAGS = ("--trace", "--trace-fst", "--trace-vcd", "--trace-saif")


def hide_internal_wires(verilog: str) -> str:
    """``verilog`` with Yosys's internal wires renamed ``\\$12`` -> ``\\_$12``: Verilator's traces leave out
    names with a leading underscore (unless ``--trace-underscore``), so a traced build records only the
    design's named signals, the ones Amaranth's own VCD writer records. Nothing else changes: each name maps to
    exactly one new name, within its module. Unchanged if the text already has such a name (a collision).

    Measured on the demo's LPDDR5X NDP device: 35,408 of its 47,666 traced signals are internal wires; without
    them the generated C++ is 22 MB instead of 43 MB and its compile 59 s of CPU instead of 103 s."""
    if "\\_$" in verilog:
        return verilog
    return _INTERNAL_WIRE.sub(r"\\_$", verilog)


def _traced(flags) -> bool:
    return any(f in TRACE_FLAGS for f in flags)


def _trace_code_slow(classes_mk: Path) -> None:
    """Compile a traced build's value-change functions (``*__Trace__N.cpp``) like its cold code (OPT_SLOW):
    they run only while a waveform is written, which the demo does for one short run of a build that otherwise
    runs untraced (saves ~5 s of CPU on the LPDDR5X NDP device)."""
    text = classes_mk.read_text()
    m = re.search(r"VM_SUPPORT_FAST \+= \\\n((?:  \S+ \\\n)*)", text)
    if m is None or "VM_SUPPORT_SLOW += \\\n" not in text:
        return                        # another Verilator's layout: leave the build as Verilator wrote it
    lines = m.group(1).splitlines(True)
    trace = [ln for ln in lines if re.search(r"__Trace__\d+ \\$", ln)]
    if not trace:
        return
    rest = [ln for ln in lines if ln not in trace]
    text = text.replace(m.group(0), "VM_SUPPORT_FAST += \\\n" + "".join(rest), 1)
    text = text.replace("VM_SUPPORT_SLOW += \\\n", "VM_SUPPORT_SLOW += \\\n" + "".join(trace), 1)
    classes_mk.write_text(text)


def _runtime_objects(runtime: Path, obj: Path) -> None:
    """Make sure ``runtime`` holds Verilator's run-time library objects (:data:`RUNTIME_OBJS`), compiling them in
    ``obj`` (a verilated model's directory, whose makefile has their rules) if no build has yet. A lock file
    makes concurrent builds (the demo's two, pytest-xdist's workers) compile them once: the others wait for it
    (~9 s of CPU each time saved)."""
    if all((runtime / o).exists() for o in RUNTIME_OBJS):
        return
    with open(runtime.with_name(runtime.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if all((runtime / o).exists() for o in RUNTIME_OBJS):
                return
            _run_tool(["make", "-j", "2", "-f", "Vharness_top.mk", *MAKE_FLAGS, *RUNTIME_OBJS], obj,
                      "make (Verilator run-time library)")
            rt_tmp = Path(tempfile.mkdtemp(prefix="tmp-runtime-", dir=BUILD_ROOT))
            for o in RUNTIME_OBJS:
                shutil.copyfile(obj / o, rt_tmp / o)
            _publish(rt_tmp, runtime)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_executable(verilog: str, ports, extra_flags=(), harness_filter=None) -> Path:
    """Compile (or find in the cache) the harness executable for Verilog ``verilog`` (top module ``top``).
    ``extra_flags``: more Verilator options (a component's ``verilator_flags()``, a backend's own);
    ``harness_filter``: a function of the C++ harness text returning the text to compile (e.g. with trace calls).

    Raises :class:`RuntimeError` with the tail of Verilator's or the C++ compiler's output on failure.
    """
    verilog = strip_zero_memory_inits(verilog)
    extra_flags = [str(f) for f in extra_flags]
    if _traced(extra_flags) and "--trace-underscore" not in extra_flags:
        verilog = hide_internal_wires(verilog)
    wrapper = _wrapper(ports, module_ports(verilog, "top"))
    harness = _harness(ports)
    if harness_filter is not None:
        harness = harness_filter(harness)
    flags = " ".join(VERILATOR_FLAGS + extra_flags + MAKE_FLAGS)
    key = hashlib.sha256("\0".join([verilog, wrapper, harness, flags]).encode()).hexdigest()
    final = BUILD_ROOT / key
    exe = final / "sim"
    if exe.exists():
        return exe
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    # One build per design at a time: another process building the same design (pytest-xdist workers that
    # need it at once) is waited for, and its executable used.
    with open(BUILD_ROOT / f"{key[:32]}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if exe.exists():
                return exe
            return _build(verilog, wrapper, harness, extra_flags, flags, key, final, exe)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _say(msg):
    """Progress of a Verilator build on a terminal (stderr a tty, or NDPIM_PROGRESS=1): builds of the large tops
    take minutes and are otherwise silent; nothing under pytest or in a pipe."""
    if os.environ.get("NDPIM_PROGRESS") == "1" or sys.stderr.isatty():
        print(f"verilator: {msg}", file=sys.stderr, flush=True)


def _build(verilog, wrapper, harness, extra_flags, flags, key, final, exe) -> Path:
    t0 = time.perf_counter()
    _say(f"building design {key[:12]} ({verilog.count(chr(10)):,} lines of Verilog; cached after this once): "
         f"verilating ...")
    rt_flags = " ".join(VERILATOR_FLAGS + [f for f in extra_flags if not _RUNTIME_NEUTRAL.fullmatch(f)] + MAKE_FLAGS)
    runtime = BUILD_ROOT / ("runtime-" + hashlib.sha256((verilator_bin_dir() + rt_flags).encode()).hexdigest()[:16])
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"tmp-{key[:12]}-", dir=BUILD_ROOT))
    try:
        (tmp / "top.v").write_text(verilog)
        (tmp / "harness_top.v").write_text(wrapper)
        (tmp / "harness.cpp").write_text(harness)
        obj = tmp / "obj"
        _run_tool(["verilator", *VERILATOR_FLAGS, *extra_flags, "--Mdir", "obj", "-o", "../sim",
                   "harness_top.v", "top.v", "harness.cpp"], tmp, "verilator")
        if _traced(extra_flags):
            _trace_code_slow(obj / "Vharness_top_classes.mk")
        _runtime_objects(runtime, obj)
        for o in RUNTIME_OBJS:  # copy2 would keep the old mtime; make must see them newer than the .mk
            shutil.copyfile(runtime / o, obj / o)
        _say(f"design {key[:12]}: C++ compile (make -j 2) ... [{time.perf_counter() - t0:.0f} s]")
        _run_tool(["make", "-j", "2", "-f", "Vharness_top.mk", *MAKE_FLAGS], obj, "make (C++ compile)")
        if not (tmp / "sim").exists():
            raise RuntimeError(f"Verilator build failed: no executable produced in {tmp}")
        shutil.rmtree(obj, ignore_errors=True)  # keep only the sources and the executable
        _publish(tmp, final)
        _say(f"design {key[:12]} built in {time.perf_counter() - t0:.1f} s")
    except RuntimeError:
        raise  # a failed build stays in `tmp` for inspection; the message names it
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return exe


def verilator_flags(component) -> list:
    """Extra Verilator options a component asks for (method ``verilator_flags()``; none by default)."""
    f = getattr(component, "verilator_flags", None)
    return list(f()) if callable(f) else []


def _encode_words(items, width) -> bytes:
    nw = _nwords(width)
    if not items or nw == 0:
        return b""
    if nw == 1:
        return np.asarray(items, dtype="<u4").tobytes()
    if nw == 2:
        return np.asarray(items, dtype="<u8").tobytes()
    return b"".join(x.to_bytes(4 * nw, "little") for x in items)


def _decode_words(buf: bytes, width) -> list:
    nw = _nwords(width)
    if nw == 1:
        return np.frombuffer(buf, dtype="<u4").tolist()
    if nw == 2:
        return np.frombuffer(buf, dtype="<u8").tolist()
    step = 4 * nw
    return [int.from_bytes(buf[i:i + step], "little") for i in range(0, len(buf), step)]


class VerilatorBackend(Backend):
    """Verilator runs of stream components. ``extra_flags`` / ``harness_filter``: build options of this backend's
    executables on top of the project's (:func:`build_executable`); :attr:`build_tag` names them."""

    name = "verilator"

    def __init__(self, *, extra_flags=(), harness_filter=None):
        # component -> executable, so reruns of the same object skip Verilog generation as well.
        self._exes = weakref.WeakKeyDictionary()
        self.extra_flags, self.harness_filter = tuple(str(f) for f in extra_flags), harness_filter

    @property
    def build_tag(self) -> str:
        """What this backend's builds add to the project's (empty for the plain backend)."""
        return " ".join(self.extra_flags) + (f" {self.harness_filter.__qualname__}" if self.harness_filter else "")

    def executable(self, component, verilog=None) -> Path:
        """The compiled harness for ``component`` (built on first use, then cached on disk). ``verilog``: its
        Verilog (top module ``top``) when the caller generated it already (e.g. to time the generation)."""
        try:
            exe = self._exes.get(component)
        except TypeError:  # not weak-referenceable or not hashable: no in-memory cache
            exe = None
        if exe is None or not exe.exists():
            exe = build_executable(verilog if verilog is not None else verilog_text(component, "top"),
                                   stream_ports(component), [*verilator_flags(component), *self.extra_flags],
                                   self.harness_filter)
            try:
                self._exes[component] = exe
            except TypeError:
                pass
        return exe

    def _run(self, component, inputs, expected, *, traffic, max_cycles, quiet_cycles):
        in_ports, out_ports, data, counts, patterns, max_cycles = self._prepare(
            component, inputs, expected, traffic, max_cycles)
        exe = self.executable(component)

        chunks = [np.array([max_cycles, quiet_cycles], dtype="<u8").tobytes()]
        for p in in_ports:
            pat = patterns[p.name].astype(np.uint8)
            chunks += [np.array([len(data[p.name]), pat.size], dtype="<u8").tobytes(), pat.tobytes(),
                       _encode_words(data[p.name], p.width)]
        for q in out_ports:
            pat = patterns[q.name].astype(np.uint8)
            # mode: 0 = not named, 1 = counted, 2 = collected whole (0 and 2: not waited for).
            collect = 0 if q.name not in counts else 2 if counts[q.name] is None else 1
            chunks += [np.array([collect, counts.get(q.name) or 0, pat.size], dtype="<u8").tobytes(),
                       pat.tobytes()]

        with tempfile.TemporaryDirectory(prefix="vlrun-") as tmp:
            stim, res = Path(tmp) / "stimulus.bin", Path(tmp) / "result.bin"
            stim.write_bytes(b"".join(chunks))
            # Run-time files of the design (e.g. a memory image read by $readmemh): +<key>=<file> plusargs.
            plusargs = []
            files = getattr(component, "verilator_runtime_files", None)
            for key, text in (files() if callable(files) else {}).items():
                path = Path(tmp) / f"{key}.dat"
                path.write_text(text)
                plusargs.append(f"+{key}={path}")
            start = time.perf_counter()
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([str(exe), str(stim), str(res), *plusargs], capture_output=True, text=True)
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall = time.perf_counter() - start
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            if proc.returncode != 0:
                raise RuntimeError(f"Verilator harness {exe} failed (exit {proc.returncode}):\n"
                                   f"{(proc.stdout + proc.stderr)[-2000:]}")
            buf = res.read_bytes()

        status, cycles = np.frombuffer(buf, dtype="<u8", count=2).tolist()
        off = 16
        outputs, seen, emitted, extra_cycle = {}, {}, {}, {}
        for q in out_ports:
            n_seen, at_done, x_cycle, n_words = np.frombuffer(buf, dtype="<u8", count=4, offset=off).tolist()
            off += 32
            items = _decode_words(buf[off:off + 4 * n_words], q.width) if q.width else [0] * n_seen
            off += 4 * n_words
            emitted[q.name] = items
            if x_cycle != 0xFFFF_FFFF_FFFF_FFFF:
                extra_cycle[q.name] = x_cycle
            if q.name in counts:
                outputs[q.name] = items[:at_done if counts[q.name] is None else counts[q.name]]
                seen[q.name] = n_seen
        if status != 0:
            raise SimulationTimeout(f"{type(component).__name__}: no completion after {max_cycles} cycles; "
                                    f"outputs collected {seen} of {counts}")
        return StreamRun(backend=self.name, outputs=outputs, cycles=cycles, wall_seconds=wall, emitted=emitted,
                         extra_cycle=extra_cycle, cpu_seconds=cpu)
