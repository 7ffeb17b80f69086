"""Shared helpers of the update tests: the server's paths and swapping the
extension's files in them, as a package upgrade does."""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAJOR = int(os.environ.get("PG_MAJOR", "15"))
# The version the build under test installs (fenced_lock.control's default).
CURRENT = next(line.split('"')[1] for line in (REPO / "Cargo.toml").read_text().splitlines()
               if line.startswith("version = "))
# The pg_config of the server the tests start (tests/harness/cluster.py runs
# the major's whole install when there is one: PG_FULL_CONFIG).
PG_CONFIG = os.environ.get("PG_FULL_CONFIG") or os.environ.get("PG_CONFIG", "/usr/bin/pg_config")


def pg_config(flag):
    return subprocess.run([PG_CONFIG, flag], capture_output=True, text=True, check=True).stdout.strip()


class ExtensionFiles:
    """The fenced_lock files of one build: the library and the extension
    directory's control file and scripts."""

    def __init__(self, root):
        self.root = Path(root)

    @classmethod
    def installed(cls, dest):
        """Copy what is installed now (the build under test) to `dest`."""
        dest = Path(dest)
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "extension").mkdir(parents=True)
        shutil.copy2(Path(pg_config("--pkglibdir")) / "fenced_lock.so", dest / "fenced_lock.so")
        for f in Path(pg_config("--sharedir"), "extension").glob("fenced_lock*"):
            shutil.copy2(f, dest / "extension" / f.name)
        return cls(dest)

    @classmethod
    def staged(cls, stage):
        """A tree laid out by `cargo pgrx package` (scripts/stage-release.sh)."""
        stage = Path(stage)
        so = next(stage.rglob("fenced_lock.so"))
        control = next(stage.rglob("fenced_lock.control"))
        dest = stage.with_name(stage.name + "-flat")
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "extension").mkdir(parents=True)
        shutil.copy2(so, dest / "fenced_lock.so")
        for f in control.parent.glob("fenced_lock*"):
            shutil.copy2(f, dest / "extension" / f.name)
        return cls(dest)

    def install(self, extra_scripts=()):
        """Replace the server's fenced_lock files with these (plus `extra_scripts`)."""
        ext = Path(pg_config("--sharedir"), "extension")
        for f in ext.glob("fenced_lock*"):
            f.unlink()
        # A new inode, as a package manager writes it: backends that loaded
        # the old library keep their mapping of the old file.
        lib = Path(pg_config("--pkglibdir")) / "fenced_lock.so"
        tmp = lib.with_suffix(".so.new")
        shutil.copy2(self.root / "fenced_lock.so", tmp)
        os.replace(tmp, lib)
        for f in list((self.root / "extension").iterdir()) + [Path(p) for p in extra_scripts]:
            shutil.copy2(f, ext / f.name)
