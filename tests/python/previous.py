"""The previous release of x_jobs and its Python client, for the tests and benchmarks that run
that client against a database updated in place.

The newest version is the control file's ``default_version``; the released versions are the
ones sql/RELEASED records (the 0.1.0 base, every full script and the target of every update
script). The previous release is the newest released version older than the newest: while a
version is open that is the last release, and when the newest itself is released, the one
before it. Its commit is the tag ``v<version>`` or, when the tag is missing, the first commit
that recorded its update script's checksum in sql/RELEASED (a released script never changes, so
its checksum finds the release whatever path the layout gives it later). Its client is
``git archive`` of that commit's python/ directory, run by this virtualenv's interpreter with
PYTHONPATH pointing at it (:func:`client_env`), so that ``python -m x_jobs worker ...`` is the
previous client; :func:`check_client` proves that a process really imports it.

bench/previous.py runs this file as a script (``python tests/python/previous.py DIR``): it
materialises the client into DIR and prints what it found as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: The checkout this file belongs to.
ROOT = Path(__file__).resolve().parents[2]

#: Where the release records live, relative to the checkout.
CONTROL = Path("sql/x_jobs.control")
RELEASED = Path("sql/RELEASED")

_DEFAULT_VERSION = re.compile(r"^default_version\s*=\s*'([^']+)'", re.MULTILINE)
#: A line of sql/RELEASED (sha256sum's format): the checksum, then a script's path.
_RELEASED_LINE = re.compile(r"^([0-9a-f]{64})\s+\*?(\S+)$")
_FULL_SCRIPT = re.compile(r"x_jobs--([0-9][0-9.]*)\.sql$")
_UPDATE_SCRIPT = re.compile(r"x_jobs--([0-9][0-9.]*)--([0-9][0-9.]*)\.sql$")

#: What a process prints to say which x_jobs it imported.
_PROBE = "import x_jobs, json; print(json.dumps([x_jobs.__version__, x_jobs.__file__]))"


class PreviousUnavailable(RuntimeError):
    """The previous release, or its client, cannot be had from this checkout."""


@dataclass(frozen=True)
class Release:
    """A released version and the commit it was released at."""

    version: str
    commit: str


@dataclass(frozen=True)
class Client:
    """A release's Python client materialised on disk: ``python`` holds its x_jobs package."""

    version: str
    commit: str
    python: Path


def version_key(version: str) -> tuple[int, ...]:
    """``"0.4.10"`` as ``(0, 4, 10)``, so that versions sort as numbers."""
    return tuple(int(part) for part in version.split("."))


def newest_version(root: Path = ROOT) -> str:
    """The version a fresh ``CREATE EXTENSION x_jobs`` installs (the control file's)."""
    found = _DEFAULT_VERSION.search((root / CONTROL).read_text())
    if found is None:
        raise PreviousUnavailable(f"{root / CONTROL} sets no default_version")
    return found.group(1)


def released_scripts(root: Path = ROOT) -> dict[str, str]:
    """Each released version and the checksum of the script that reaches it: its update script
    when one is recorded, else its full script (the 0.1.0 base)."""
    path = root / RELEASED
    if not path.exists():
        raise PreviousUnavailable(f"{path} is missing: no release is recorded")
    full: dict[str, str] = {}
    updates: dict[str, str] = {}
    for line in path.read_text().splitlines():
        matched = _RELEASED_LINE.match(line.strip())
        if matched is None:
            continue
        checksum, script = matched.groups()
        if update := _UPDATE_SCRIPT.search(script):
            updates[update.group(2)] = checksum
        elif whole := _FULL_SCRIPT.search(script):
            full[whole.group(1)] = checksum
    return full | updates


def previous_version(root: Path = ROOT) -> str:
    """The newest released version older than the newest version."""
    newest = version_key(newest_version(root))
    older = [v for v in released_scripts(root) if version_key(v) < newest]
    if not older:
        raise PreviousUnavailable(
            f"{root / RELEASED} records no release older than {newest_version(root)}"
        )
    return max(older, key=version_key)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
    )


def _find_commit(root: Path, version: str, checksum: str) -> str | None:
    tagged = _git(root, "rev-parse", "--verify", "--quiet", f"refs/tags/v{version}^{{commit}}")
    if tagged.returncode == 0 and tagged.stdout.strip():
        return tagged.stdout.strip()
    # -S finds the commits that changed how often the checksum occurs: the first one added it.
    recorded = _git(root, "log", "--reverse", "--format=%H", "-S", checksum)
    commits = recorded.stdout.split()
    return commits[0] if recorded.returncode == 0 and commits else None


def release(version: str, root: Path = ROOT) -> Release:
    """The commit ``version`` was released at. A shallow clone is deepened first when it lacks
    it (``git fetch --unshallow --tags``); PreviousUnavailable says what is missing otherwise."""
    scripts = released_scripts(root)
    if version not in scripts:
        raise PreviousUnavailable(f"{version} is not recorded as released in {root / RELEASED}")
    checksum = scripts[version]
    commit = _find_commit(root, version, checksum)
    if commit is None:
        shallow = _git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        fetched = _git(root, "fetch", *(["--unshallow"] if shallow else []), "--tags", "--quiet")
        if fetched.returncode != 0:
            logger.warning("git fetch for release %s failed: %s", version, fetched.stderr.strip())
        commit = _find_commit(root, version, checksum)
    if commit is None:
        raise PreviousUnavailable(
            f"the commit of release {version} is not in {root}: neither the tag v{version} nor a "
            f"commit recording its script's checksum {checksum} in {RELEASED} was found, even "
            "after `git fetch --unshallow --tags`. Clone with the full history and the tags "
            f"(or fetch the tag v{version}) to run the previous client."
        )
    return Release(version=version, commit=commit)


def materialise(found: Release, into: Path, root: Path = ROOT) -> Client:
    """``git archive`` of the release's python/ directory, unpacked under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / f"x_jobs-{found.version}.tar"
    made = _git(root, "archive", "--format=tar", f"--output={archive}", found.commit, "python")
    if made.returncode != 0:
        raise PreviousUnavailable(
            f"git archive of python/ at {found.commit} (release {found.version}) failed: "
            + made.stderr.strip()
        )
    unpacked = subprocess.run(
        ["tar", "-x", "-f", str(archive), "-C", str(into)],
        capture_output=True,
        text=True,
        check=False,
    )
    archive.unlink()
    if unpacked.returncode != 0:
        raise PreviousUnavailable(f"unpacking {archive} failed: {unpacked.stderr.strip()}")
    python = into / "python"
    if not (python / "x_jobs" / "__init__.py").exists():
        raise PreviousUnavailable(f"release {found.version} has no python/x_jobs at {found.commit}")
    return Client(version=found.version, commit=found.commit, python=python)


def client_env(
    client: Client, extra_path: Sequence[Path] = (), base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a process that runs ``client``: its package first on PYTHONPATH
    (ahead of the virtualenv's editable install of this checkout), then ``extra_path`` (the app
    modules), and nothing else of the caller's PYTHONPATH (which names this checkout)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [client.python, *extra_path])
    return env


def check_client(client: Client, extra_path: Sequence[Path] = ()) -> None:
    """Fail unless a process started with :func:`client_env` imports the release's client."""
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=client_env(client, extra_path),
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise PreviousUnavailable(
            f"the client of {client.version} does not import: {probe.stderr.strip()}"
        )
    version, module = json.loads(probe.stdout)
    if version != client.version or not Path(module).is_relative_to(client.python):
        raise PreviousUnavailable(
            f"a process meant to run the client of {client.version} imported x_jobs {version} "
            f"from {module}, not from {client.python}"
        )


def previous_client(into: Path, root: Path = ROOT) -> Client:
    """The previous release's client, materialised under ``into`` and checked."""
    client = materialise(release(previous_version(root), root), into, root)
    check_client(client)
    return client


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Materialise the previous release's client.")
    parser.add_argument("into", nargs="?", help="directory to unpack into (default: a new one)")
    args = parser.parse_args(argv)
    into = Path(args.into) if args.into else Path(tempfile.mkdtemp(prefix="x_jobs_previous."))
    try:
        client = previous_client(into)
    except PreviousUnavailable as err:
        print(f"previous.py: {err}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(client) | {"python": str(client.python)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
