"""Results directories: the release evidence every benchmark command leaves behind.

How this works: a benchmark opens :class:`Results` as a context manager at start-up.  That
creates ``bench/results/<name>-<UTC time>-<git rev>/`` and records, before anything runs, the
environment (CPU model, cores, memory, kernel, distribution, Python, every installed package
version, gcc, GPU and driver through ``nvidia-smi`` when present, load average), the git
revision with a dirty flag (and, when dirty, the diff against HEAD so the exact source is
known) and the benchmark's own command line.  While it runs, the benchmark:

- mirrors its console into ``raw/console.txt`` (:meth:`Results.tee`; the console output
  itself is unchanged);
- runs every measuring command through :meth:`Results.run`, which keeps that command's
  complete stdout and stderr under ``raw/`` and its exact command line, exit status and
  duration in ``commands.txt`` (commands started some other way are noted with
  :meth:`Results.note_command`);
- writes its figures with :meth:`Results.summary`: a short markdown table in ``summary.md``
  and the headline figures in ``summary.json`` (read by ``bench/all``).

On exit the load average at the end is added, ``manifest.json`` says whether the benchmark
finished or failed, and ``SHA256SUMS`` (``sha256sum`` format, every file but itself) seals
the directory: ``sha256sum -c SHA256SUMS`` inside it, or ``python bench/_results.py verify
DIR``, shows that nothing was changed afterwards.

Stdlib only, so a benchmark can run under any Python 3.11 that can import the repository.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

__all__ = [
    "REPO",
    "RESULTS_ROOT",
    "Results",
    "collect_environment",
    "git_state",
    "markdown_table",
    "verify",
    "write_checksums",
]

REPO = Path(__file__).resolve().parent.parent
#: Where results directories go by default (gitignored).
RESULTS_ROOT = REPO / "bench" / "results"
CHECKSUMS = "SHA256SUMS"


def _run_text(argv: Sequence[str], timeout: float = 20.0) -> str | None:
    """stdout of a helper command, or None if it is missing or fails."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True)
class GitState:
    """The source revision a benchmark ran."""

    revision: str
    short: str
    dirty: bool
    branch: str
    status: str  # ``git status --porcelain`` (what makes it dirty)
    diff: str  # ``git diff HEAD`` when dirty

    def label(self) -> str:
        return f"{self.short}{' (dirty)' if self.dirty else ''}"


def git_state(repo: Path = REPO) -> GitState:
    """Revision, dirty flag and diff of ``repo`` (``unknown`` outside a git checkout)."""
    git = ["git", "-C", str(repo)]
    revision = (_run_text([*git, "rev-parse", "HEAD"]) or "unknown").strip()
    if revision == "unknown":
        return GitState("unknown", "unknown", False, "unknown", "", "")
    # Results directories are gitignored, so a benchmark never dirties its own checkout.
    status = _run_text([*git, "status", "--porcelain"]) or ""
    dirty = bool(status.strip())
    return GitState(
        revision=revision,
        short=revision[:12],
        dirty=dirty,
        branch=(_run_text([*git, "rev-parse", "--abbrev-ref", "HEAD"]) or "unknown").strip(),
        status=status,
        diff=(_run_text([*git, "diff", "HEAD"]) or "") if dirty else "",
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _distribution() -> str:
    try:
        info = platform.freedesktop_os_release()
    except OSError:
        return "unknown"
    return info.get("PRETTY_NAME") or info.get("NAME", "unknown")


def loadavg() -> str:
    """The 1/5/15-minute load averages (a shared machine's figures depend on them)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def _gpus() -> tuple[list[dict[str, str]], str | None]:
    """GPUs and driver from ``nvidia-smi`` (empty when absent), and its full output."""
    if shutil.which("nvidia-smi") is None:
        return [], None
    fields = ["index", "name", "driver_version", "memory.total", "uuid"]
    query = _run_text(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"])
    gpus = []
    for line in (query or "").splitlines():
        values = [value.strip() for value in line.split(",")]
        if len(values) == len(fields):
            gpus.append(dict(zip(fields, values, strict=True)))
    return gpus, _run_text(["nvidia-smi"])


def collect_environment() -> dict[str, Any]:
    """Everything about the machine and software that a reader needs to judge a figure."""
    uname = platform.uname()
    gcc = _run_text(["gcc", "--version"])
    gpus, _ = _gpus()
    try:
        from hami_trio._version import __version__ as version
    except ImportError:
        version = "unknown"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "hami_trio_version": version,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": _meminfo_gib(),
        "kernel": f"{uname.system} {uname.release} {uname.version} {uname.machine}",
        "distribution": _distribution(),
        "python": sys.version.replace("\n", " "),
        "python_executable": sys.executable,
        "gcc": gcc.splitlines()[0] if gcc else "not found",
        "gpus": gpus or "none (nvidia-smi not found or no GPU)",
        "euid": os.geteuid(),
        "nofile_limit": f"{soft}/{hard}",
        "loadavg_start": loadavg(),
        "packages": _packages(),
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table (cells converted with ``str``)."""
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(
        p for p in directory.rglob("*") if p.is_file() and p.relative_to(directory).as_posix()
    )


def write_checksums(directory: Path) -> Path:
    """Write ``SHA256SUMS`` over every file below ``directory`` (except itself).

    The format is ``sha256sum``'s, so ``cd DIR && sha256sum -c SHA256SUMS`` checks it.
    Nested results directories (``bench/all``) are covered file by file.
    """
    out = directory / CHECKSUMS
    lines = [
        f"{_sha256(path)}  {path.relative_to(directory).as_posix()}"
        for path in _files(directory)
        if path != out
    ]
    out.write_text("\n".join(lines) + "\n")
    return out


def verify(directory: Path) -> list[str]:
    """Problems with a sealed results directory (empty when every file matches).

    Reports files that changed, files listed but missing, and files not listed.
    """
    sums = directory / CHECKSUMS
    if not sums.is_file():
        return [f"{sums}: missing"]
    listed: dict[str, str] = {}
    for number, line in enumerate(sums.read_text().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            return [f"{sums}:{number}: not a sha256sum line: {line!r}"]
        listed[name] = digest
    problems = []
    present = {p.relative_to(directory).as_posix() for p in _files(directory) if p != sums}
    for name, digest in listed.items():
        path = directory / name
        if name not in present:
            problems.append(f"{name}: listed but missing")
        elif _sha256(path) != digest:
            problems.append(f"{name}: checksum mismatch")
    problems += [f"{name}: not listed" for name in sorted(present - listed.keys())]
    return problems


class _Tee(io.TextIOBase):
    """A text stream writing to the console and to a file."""

    def __init__(self, console: TextIO, copy: TextIO) -> None:
        self._console = console
        self._copy = copy

    def write(self, text: str) -> int:
        self._console.write(text)
        self._copy.write(text)
        return len(text)

    def flush(self) -> None:
        self._console.flush()
        self._copy.flush()


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _safe(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return cleaned.strip("._") or "run"


class Results:
    """One benchmark run's results directory (see the module docstring).

    Args:
        name: the benchmark (``broker_load``, ``concurrent_start``, ...).
        argv: its command line (default ``sys.argv``), recorded with the interpreter.
        root: parent directory (default ``bench/results``).
        path: use exactly this directory instead (it must not exist yet).
    """

    def __init__(
        self,
        name: str,
        *,
        argv: Sequence[str] | None = None,
        root: Path | None = None,
        path: Path | None = None,
    ) -> None:
        self.name = name
        self.started = _utc_now()
        self.git = git_state()
        if path is None:
            stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
            dirty = "-dirty" if self.git.dirty else ""
            base = (root or RESULTS_ROOT) / f"{name}-{stamp}-{self.git.short[:8]}{dirty}"
            path, suffix = base, 1
            while path.exists():
                suffix += 1
                path = base.with_name(f"{base.name}.{suffix}")
        self.path = path
        self.raw_dir = path / "raw"
        self.raw_dir.mkdir(parents=True)
        self.argv = [sys.executable, *(sys.argv if argv is None else argv)]
        self.environment = collect_environment()
        self._commands: list[dict[str, Any]] = []
        self._raw_names: set[str] = set()
        self._sealed = False
        self.write_json("environment.json", self.environment)
        if self.git.dirty:
            (path / "source.diff").write_text(self.git.diff)
            (path / "source.status").write_text(self.git.status)
        _, smi = _gpus()
        if smi is not None:
            self.raw("nvidia-smi.txt", smi)

    # -- context manager ------------------------------------------------------------------

    def __enter__(self) -> Results:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(status="finished" if exc is None else f"failed: {exc_type.__name__}: {exc}")  # type: ignore[union-attr]

    # -- recording ------------------------------------------------------------------------

    def write_json(self, name: str, data: object) -> Path:
        """Write ``data`` as indented JSON to ``name`` in the results directory."""
        out = self.path / name
        out.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        return out

    def raw_path(self, name: str) -> Path:
        """A fresh path under ``raw/`` (a numeric suffix keeps names unique)."""
        safe = _safe(name)
        stem, dot, ext = safe.partition(".")
        candidate, number = safe, 1
        while candidate in self._raw_names or (self.raw_dir / candidate).exists():
            number += 1
            candidate = f"{stem}.{number}{dot}{ext}"
        self._raw_names.add(candidate)
        return self.raw_dir / candidate

    def raw(self, name: str, text: str | bytes) -> Path:
        """Keep some raw output under ``raw/``; returns its path."""
        out = self.raw_path(name)
        if isinstance(text, bytes):
            out.write_bytes(text)
        else:
            out.write_text(text)
        return out

    def note_command(
        self,
        argv: Sequence[str],
        *,
        name: str,
        returncode: int | None,
        seconds: float | None,
        outputs: Sequence[Path] = (),
        note: str = "",
    ) -> None:
        """Record a command run some other way (a server, a sandboxed client)."""
        self._commands.append(
            {
                "name": name,
                "command": shlex.join(str(a) for a in argv),
                "returncode": returncode,
                "seconds": None if seconds is None else round(seconds, 6),
                "outputs": [p.relative_to(self.path).as_posix() for p in outputs],
                "note": note,
            }
        )

    def stream(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        name: str,
        cwd: Path | None = None,
    ) -> int:
        """Run a long command, echoing its output (stdout and stderr merged) line by line to
        the console while keeping all of it in ``raw/<name>.out``; returns its exit status."""
        args = [os.fspath(a) for a in argv]
        out = self.raw_path(f"{name}.out")
        start = time.monotonic()
        with (
            out.open("w") as copy,
            subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd
            ) as proc,
        ):
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                copy.write(line)
            returncode = proc.wait()
        self.note_command(
            args, name=name, returncode=returncode, seconds=time.monotonic() - start, outputs=[out]
        )
        return returncode

    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        name: str,
        check: bool = False,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command, keeping its stdout and stderr under ``raw/`` and its command line.

        Args:
            argv: the command.
            name: base name of its raw files (``raw/<name>.out``, ``raw/<name>.err``).
            check: raise :class:`subprocess.CalledProcessError` on a non-zero exit (after
                recording it).
            timeout: seconds before the command is killed (``subprocess.TimeoutExpired``).
            env: its environment (default: this process's).
            cwd: its working directory.
            stdin: text for its standard input.

        Returns:
            The completed process, with ``stdout``/``stderr`` as text.
        """
        args = [os.fspath(a) for a in argv]
        start = time.monotonic()
        try:
            done = subprocess.run(
                args,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=None if env is None else dict(env),
                cwd=cwd,
                input=stdin,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = self.raw(f"{name}.out", _text(exc.stdout))
            err = self.raw(f"{name}.err", _text(exc.stderr))
            self.note_command(
                args,
                name=name,
                returncode=None,
                seconds=time.monotonic() - start,
                outputs=[out, err],
                note=f"killed after {timeout} s",
            )
            raise
        seconds = time.monotonic() - start
        out = self.raw(f"{name}.out", done.stdout)
        err = self.raw(f"{name}.err", done.stderr)
        self.note_command(
            args,
            name=name,
            returncode=done.returncode,
            seconds=seconds,
            outputs=[out, err],
            note=f"cwd {cwd}" if cwd else "",
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, args, done.stdout, done.stderr)
        return done

    @contextlib.contextmanager
    def tee(self) -> Iterator[None]:
        """Copy everything printed to stdout and stderr into ``raw/console.txt``."""
        path = self.raw_path("console.txt")
        with path.open("w") as copy:
            old_out, old_err = sys.stdout, sys.stderr
            sys.stdout = _Tee(old_out, copy)  # type: ignore[assignment]
            sys.stderr = _Tee(old_err, copy)  # type: ignore[assignment]
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                sys.stdout, sys.stderr = old_out, old_err

    def summary(
        self,
        title: str,
        *,
        headers: Sequence[str],
        rows: Sequence[Sequence[object]],
        figures: Mapping[str, object],
        notes: Sequence[str] = (),
    ) -> None:
        """Write ``summary.md`` (a short table) and ``summary.json`` (headline figures).

        Args:
            title: the benchmark's one-line title.
            headers: the table's column names.
            rows: its rows.
            figures: headline figures by name (numbers or short strings), for ``bench/all``.
            notes: lines printed under the table (how to read it, caveats).
        """
        env = self.environment
        text = [
            f"# {title}\n",
            f"- command: `{shlex.join(self.argv)}`",
            f"- source: {self.git.label()} on {self.git.branch}, hami-trio "
            f"{env['hami_trio_version']}",
            f"- machine: {env['cpu_model']} x{env['cpu_count']}, {env['memory_gib']} GiB, "
            f"{env['distribution']}, kernel {platform.release()}, Python "
            f"{platform.python_version()}",
            f"- GPU: {_gpu_line(env['gpus'])}",
            f"- load average at start: {env['loadavg_start']}",
            f"- started {self.started.isoformat(timespec='seconds')}",
            "",
            markdown_table(headers, rows),
        ]
        text += [f"{line}\n" for line in notes if line]
        (self.path / "summary.md").write_text("\n".join(text).rstrip() + "\n")
        self.write_json(
            "summary.json", {"benchmark": self.name, "title": title, "figures": dict(figures)}
        )

    def finish(self, status: str = "finished") -> Path:
        """Write the command list and manifest, then seal the directory with SHA256SUMS.

        Returns:
            The path of ``SHA256SUMS``.  Calling it again does nothing more.
        """
        sums = self.path / CHECKSUMS
        if self._sealed:
            return sums
        self._sealed = True
        finished = _utc_now()
        lines = [f"# {self.name}: exact command lines, in order", f"$ {shlex.join(self.argv)}"]
        for cmd in self._commands:
            rc = "no exit status" if cmd["returncode"] is None else f"rc={cmd['returncode']}"
            took = "" if cmd["seconds"] is None else f" {cmd['seconds']:.3f} s"
            note = f" ({cmd['note']})" if cmd["note"] else ""
            outputs = f" -> {', '.join(cmd['outputs'])}" if cmd["outputs"] else ""
            lines.append(f"$ {cmd['command']}\n  # {cmd['name']}: {rc}{took}{note}{outputs}")
        (self.path / "commands.txt").write_text("\n".join(lines) + "\n")
        self.write_json(
            "manifest.json",
            {
                "benchmark": self.name,
                "status": status,
                "command": shlex.join(self.argv),
                "started": self.started.isoformat(),
                "finished": finished.isoformat(),
                "seconds": round((finished - self.started).total_seconds(), 3),
                "git_revision": self.git.revision,
                "git_dirty": self.git.dirty,
                "git_branch": self.git.branch,
                "loadavg_end": loadavg(),
                "commands": self._commands,
            },
        )
        return write_checksums(self.path)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _gpu_line(gpus: object) -> str:
    if isinstance(gpus, list) and gpus:
        return "; ".join(
            f"{g.get('name')} (driver {g.get('driver_version')}, {g.get('memory.total')})"
            for g in gpus
        )
    return str(gpus)


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "verify":
        print("usage: python bench/_results.py verify RESULTS_DIR", file=sys.stderr)
        return 2
    problems = verify(Path(argv[1]))
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{argv[1]}: every file matches {CHECKSUMS}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
