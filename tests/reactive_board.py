"""A reactive fake board: a fake tree whose power rails, temperatures and current clocks follow
the limits written to it and the load the test sets.

Files in a fake tree are plain files, so nothing reacts by itself; :class:`ReactiveBoard` is a
thread in the test process that looks at the tree every ``period_s`` (the daemon under test is
another process writing its limits there) and rewrites the outputs a kernel would update:

- **clocks** (``scaling_cur_freq``, devfreq ``cur_freq``) from the governor and the limits:
  ``performance`` runs at max, ``powersave`` at min, ``userspace`` at ``scaling_setspeed``;
  every load-following governor (schedutil, ondemand, nvhost_podgov, simple_ondemand, ...) at
  the lowest table frequency >= 1.25 x util x top frequency (schedutil's rule), within
  [min, max]. A policy whose CPUs are all offline runs nothing.
- **power**, per device: ``P = k x util x f_GHz ^ alpha`` (dynamic power ~ f V^2 with V ~ f, so
  ``alpha = 3``), times the online cores for a cpufreq policy; plus a static draw per rail.
  Rails are the board's own INA3221 channels, matched by label: a rail whose label names CPU or
  GPU carries those devices' dynamic power plus its static draw; other rails only their static
  draw; ``VDD_IN`` (the module input) is the sum of the others plus the module's own overhead.
  Each rail is written as the snapshot's voltage (``inN_input``, mV) and the current that makes
  the power (``currN_input``, mA), like the real driver.
- **temperatures**: every readable zone at ``ambient + theta x P(VDD_IN)`` (steady state,
  no thermal inertia: a test waits for the daemon, never for the model), ``theta`` per zone
  type.

Outputs are written atomically (temp file + rename) and only when they change, so a reader
never sees half a number. :meth:`ReactiveBoard.close` stops the thread and puts every file it
wrote back to its snapshot text, so a test can compare the whole tree with the one it built.

The numbers (:class:`BoardModel`) are round figures of an Orin NX 16GB under load (about 4 W
per 4-core A78AE cluster at 1.98 GHz, 6 W for the GPU at 918 MHz, ~3.3 W static); they do not
claim to be the board's, only to respond the way a board does.
"""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

CPUFREQ = "sys/devices/system/cpu/cpufreq"
CPU = "sys/devices/system/cpu"
DEVFREQ = "sys/class/devfreq"
HWMON = "sys/class/hwmon"
THERMAL = "sys/class/thermal"
FIXED = ("performance", "powersave", "userspace")


@dataclass
class BoardModel:
    """The power and thermal model (see the module docstring). Mutable: a test changes the load
    or the ambient temperature while the board runs (:meth:`ReactiveBoard.set`)."""

    util_cpu: float = 1.0            # 0..1, every core
    util_gpu: float = 1.0            # 0..1
    k_cpu_w: float = 0.13            # W per core at 1 GHz, full load
    k_gpu_w: float = 7.7             # W for the GPU at 1 GHz, full load
    alpha: float = 3.0
    static_w: dict[str, float] = field(default_factory=lambda: {
        "VDD_CPU_GPU_CV": 0.6, "VDD_SOC": 1.5})
    module_w: float = 1.2            # VDD_IN beyond the sum of the other rails
    ambient_c: float = 25.0
    theta_c_per_w: dict[str, float] = field(default_factory=lambda: {
        "tj-thermal": 2.4, "cpu-thermal": 2.2, "gpu-thermal": 2.3})
    theta_default: float = 2.0

    def dynamic_w(self, kind: str, f_ghz: float, cores: int = 1) -> float:
        k, util = (self.k_cpu_w, self.util_cpu) if kind == "cpu" else (self.k_gpu_w,
                                                                       self.util_gpu)
        return cores * k * util * f_ghz ** self.alpha


@dataclass
class Evaluation:
    """What the model says the board does now."""

    running: dict[str, int]                  # device dir (relative) -> frequency (kHz / Hz)
    device_w: dict[str, float]               # device name -> dynamic power
    rails_w: dict[str, float]                # rail label -> power
    total_w: float
    temps_c: dict[str, float]                # zone dir (relative) -> temperature


def _read(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode()
    except OSError:
        return None
    finally:
        os.close(fd)


def _int(path: Path) -> int | None:
    text = (_read(path) or "").strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else None


def _cpus(text: str | None) -> list[int]:
    out: list[int] = []
    for part in re.split(r"[,\s]+", (text or "").strip()):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += range(int(lo), int(hi) + 1)
        elif part:
            out.append(int(part))
    return out


def load_following(table: list[int], util: float, lo: int, hi: int) -> int:
    """schedutil's rule: the lowest table frequency >= 1.25 x util x the top one, in [lo, hi]."""
    want = 1.25 * util * table[-1]
    pick = next((f for f in table if f >= want), table[-1])
    return max(lo, min(hi, pick))


class ReactiveBoard:
    """Keeps a fake tree's outputs in step with its limits (see the module docstring)."""

    def __init__(self, root: Path, model: BoardModel | None = None,
                 period_s: float = 0.01) -> None:
        self.root = Path(root).resolve()
        self.model = model or BoardModel()
        self.period_s = period_s
        self._originals: dict[Path, bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reactive-board", daemon=True)
        self.last: Evaluation | None = None
        self.update()

    # ---- the model on the tree ---------------------------------------------------------------
    def evaluate(self) -> Evaluation | None:
        """The model on the tree's limits now (None while a limit file is mid-write)."""
        m = self.model
        running: dict[str, int] = {}
        device_w: dict[str, float] = {}
        cpu_w = gpu_w = 0.0
        base = self.root / CPUFREQ
        for pol in sorted(base.glob("policy*")) if base.is_dir() else []:
            cpus = _cpus(_read(pol / "related_cpus"))
            online = [c for c in cpus if _int(self.root / CPU / f"cpu{c}" / "online") != 0]
            if not online:
                device_w[pol.name] = 0.0
                continue
            table = sorted({int(x) for x in (_read(pol / "scaling_available_frequencies")
                                             or "").split()})
            gov = (_read(pol / "scaling_governor") or "").strip()
            lo, hi = _int(pol / "scaling_min_freq"), _int(pol / "scaling_max_freq")
            if not table or not gov or lo is None or hi is None:
                return None
            if gov == "performance":
                f = hi
            elif gov == "powersave":
                f = lo
            elif gov == "userspace":
                f = _int(pol / "scaling_setspeed") or lo
            else:
                f = load_following(table, m.util_cpu, lo, hi)
            running[str(pol.relative_to(self.root))] = f
            device_w[pol.name] = m.dynamic_w("cpu", f / 1e6, len(online))
            cpu_w += device_w[pol.name]
        dbase = self.root / DEVFREQ
        for link in sorted(dbase.iterdir()) if dbase.is_dir() else []:
            dev = link.resolve()
            table = sorted({int(x) for x in (_read(dev / "available_frequencies") or "").split()})
            gov = (_read(dev / "governor") or "").strip()
            lo, hi = _int(dev / "min_freq"), _int(dev / "max_freq")
            if not table or not gov or lo is None or hi is None:
                return None
            f = hi if gov == "performance" else lo if gov == "powersave" \
                else load_following(table, m.util_gpu, lo, hi)
            running[str(dev.relative_to(self.root))] = f
            device_w[link.name] = m.dynamic_w("gpu", f / 1e9)
            gpu_w += device_w[link.name]
        rails: dict[str, float] = {}
        for label in self._rails():
            if label == "VDD_IN":
                continue
            up = label.upper()
            rails[label] = m.static_w.get(label, 0.0) + (cpu_w if "CPU" in up else 0.0) \
                + (gpu_w if "GPU" in up else 0.0)
        total = sum(rails.values()) + m.module_w
        rails["VDD_IN"] = total
        temps = {}
        tbase = self.root / THERMAL
        for link in sorted(tbase.iterdir()) if tbase.is_dir() else []:
            zone = link.resolve()
            if not (zone / "temp").is_file():   # FIFOs: zones that read EAGAIN stay so
                continue
            kind = (_read(zone / "type") or "").strip()
            theta = m.theta_c_per_w.get(kind, m.theta_default)
            temps[str(zone.relative_to(self.root))] = m.ambient_c + theta * total
        return Evaluation(running, device_w, rails, total, temps)

    def _hwmon(self) -> Path | None:
        base = self.root / HWMON
        for link in sorted(base.iterdir()) if base.is_dir() else []:
            if (_read(link / "name") or "").strip() == "ina3221":
                return link.resolve()
        return None

    def _rails(self) -> dict[str, int]:
        """Rail label -> INA3221 channel number (unconnected and sum channels left out)."""
        hw = self._hwmon()
        if hw is None:
            raise AssertionError(f"{self.root}: the reactive board needs an INA3221 hwmon")
        out = {}
        for entry in sorted(hw.glob("in*_label")):
            label = (_read(entry) or "").strip()
            n = int(entry.name[2:].split("_")[0])
            if label and label != "NC" and "sum of shunt" not in label.lower():
                out[label] = n
        return out

    # ---- writing -----------------------------------------------------------------------------
    def _put(self, path: Path, text: str) -> None:
        data = text.encode()
        if path not in self._originals:
            old = path.read_bytes() if path.is_file() else None
            if old is None:
                raise AssertionError(f"{path}: the reactive board only rewrites existing files")
            self._originals[path] = old
        if path.read_bytes() == data:
            return
        tmp = path.with_name(f".{path.name}.reactive")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def update(self) -> Evaluation | None:
        """Evaluate the model once and write its outputs (the thread calls this every period)."""
        with self._lock:
            ev = self.evaluate()
            if ev is None:
                return None
            for rel, f in ev.running.items():
                d = self.root / rel
                name = "scaling_cur_freq" if (d / "scaling_cur_freq").exists() else "cur_freq"
                self._put(d / name, f"{f}\n")
            hw = self._hwmon()
            assert hw is not None
            for label, n in self._rails().items():
                mv = _int(hw / f"in{n}_input") or 5000
                self._put(hw / f"curr{n}_input", f"{math.floor(ev.rails_w[label] * 1e6 / mv)}\n")
            for rel, c in ev.temps_c.items():
                self._put(self.root / rel / "temp", f"{round(c * 1000)}\n")
            self.last = ev
            return ev

    def set(self, **changes: float) -> Evaluation | None:
        """Change the model (``util_cpu``, ``util_gpu``, ``ambient_c`` ...) and apply it now."""
        with self._lock:
            for key, value in changes.items():
                if not hasattr(self.model, key):
                    raise AttributeError(f"BoardModel has no {key!r}")
                setattr(self.model, key, value)
        return self.update()

    def power_w(self) -> float:
        """VDD_IN as the daemon reads it: the written mV x mA of the VDD_IN channel."""
        hw = self._hwmon()
        assert hw is not None
        n = self._rails()["VDD_IN"]
        return (_int(hw / f"in{n}_input") or 0) * (_int(hw / f"curr{n}_input") or 0) / 1e6

    def outputs(self) -> set[str]:
        """Board paths (``/sys/...``) of the files this has rewritten so far."""
        return {"/" + str(p.relative_to(self.root)) for p in self._originals}

    # ---- thread ------------------------------------------------------------------------------
    def start(self) -> ReactiveBoard:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.update()
            except OSError:  # a file mid-replace by the daemon: next period
                continue

    def close(self) -> None:
        """Stop reacting and put every file this wrote back to its original bytes."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._lock:
            for path, data in self._originals.items():
                path.write_bytes(data)
