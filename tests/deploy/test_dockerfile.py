"""The Dockerfile cannot be built here (no container engine); this checks what
can be checked without one: every COPY source exists, the stages the Kubernetes
manifests use exist, the runtime stages run as a non-root user, and their
entrypoints are console scripts that pyproject.toml declares.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from fnmatch import fnmatch

import pytest

from tests.helpers.paths import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = REPO
DOCKERFILE = ROOT / "Dockerfile"
# Agreed names: the webhook Deployment runs `gpuflame webhook ...`; the init
# container the webhook adds runs `gpuflame-payload-install /gpuflame`.
ENTRYPOINTS = {"webhook": "gpuflame", "payload": "gpuflame-payload-install"}


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str | None:
        values = [arg for kw, arg in self.instructions if kw == keyword]
        return values[-1] if values else None


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuations joined."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and line.lstrip().startswith("#"):
            continue
        if buf and line.lstrip().startswith("#"):  # comment inside a continued RUN
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        if buf.strip():
            kw, _, arg = buf.strip().partition(" ")
            out.append((kw.upper(), arg.strip()))
        buf = ""
    return out


def stages() -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    current: Stage | None = None
    for kw, arg in instructions(DOCKERFILE.read_text()):
        if kw == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", arg, re.IGNORECASE)
            assert m, arg
            current = Stage(name=(m.group(2) or str(len(found))).lower(), base=m.group(1))
            found[current.name] = current
        elif current is not None:
            current.instructions.append((kw, arg))
    return found


def inherited(all_stages: dict[str, Stage], name: str, keyword: str) -> str | None:
    """An instruction's effective value in a stage, following FROM <stage>."""
    stage = all_stages[name]
    value = stage.last(keyword)
    if value is None and stage.base.lower() in all_stages:
        return inherited(all_stages, stage.base.lower(), keyword)
    return value


def exec_form(arg: str) -> list[str]:
    return json.loads(arg) if arg.startswith("[") else shlex.split(arg)


def console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def dockerignored(rel: str) -> bool:
    """Docker's rules, as far as this repository's .dockerignore uses them (last match wins)."""
    ignored = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def test_stages_for_the_webhook_and_the_payload_exist():
    s = stages()
    assert {"builder", "webhook", "payload"} <= set(s)
    # a plain `docker build .` makes the webhook image
    assert list(s)[-1] == "webhook"
    assert s["builder"].base.startswith("python:") and "slim" in s["builder"].base


def test_builder_makes_wheels_of_the_project():
    runs = [arg for kw, arg in stages()["builder"].instructions if kw == "RUN"]
    assert any("pip wheel" in r for r in runs)


def test_every_copy_source_exists_and_is_not_dockerignored():
    for name, stage in stages().items():
        for kw, arg in stage.instructions:
            if kw not in ("COPY", "ADD"):
                continue
            words = exec_form(arg)
            if any(w.startswith("--from=") for w in words):
                continue  # from another stage, not the build context
            sources = [w for w in words if not w.startswith("--")][:-1]
            assert sources, f"{name}: {kw} {arg}"
            for src in sources:
                path = ROOT / src
                assert path.exists(), f"stage {name}: {kw} source {src} does not exist"
                assert not dockerignored(src.rstrip("/")), f"stage {name}: {src} is excluded by .dockerignore"


def test_runtime_stages_run_as_non_root():
    s = stages()
    for name in ENTRYPOINTS:
        user = inherited(s, name, "USER")
        assert user, f"stage {name} has no USER"
        uid = user.split(":")[0]
        assert uid not in ("root", "0"), f"stage {name} runs as {user}"
        # numeric, so Kubernetes' runAsNonRoot can check it without /etc/passwd
        assert uid.isdigit(), f"stage {name}: USER {user} is not numeric"


def test_entrypoints_are_declared_console_scripts():
    s = stages()
    scripts = console_scripts()
    for name, script in ENTRYPOINTS.items():
        entry = inherited(s, name, "ENTRYPOINT")
        assert entry, f"stage {name} has no ENTRYPOINT"
        argv = exec_form(entry)
        assert argv[0] == script, f"stage {name}: ENTRYPOINT {argv}"
        assert script in scripts, f"{script} is not in pyproject.toml [project.scripts]"


def test_payload_default_destination_is_the_agreed_mount():
    cmd = exec_form(inherited(stages(), "payload", "CMD"))
    assert cmd == ["/gpuflame"]


def test_webhook_default_command_matches_the_deployment():
    cmd = exec_form(inherited(stages(), "webhook", "CMD"))
    assert cmd[0] == "webhook"
    opts = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert opts == {"--tls-cert": "/tls/tls.crt", "--tls-key": "/tls/tls.key", "--port": "8443"}
    assert "8443" in (inherited(stages(), "webhook", "EXPOSE") or "")


def test_pyproject_readme_is_in_the_build_context():
    """pip wheel reads project.readme; the builder copies it."""
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    copied = [w for kw, arg in stages()["builder"].instructions if kw == "COPY" for w in exec_form(arg)]
    assert readme in copied
