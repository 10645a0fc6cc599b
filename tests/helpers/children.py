"""Child processes: this checkout's src in every child, the loss lines a run prints, a webhook pod's environment."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from gpuflame.webhook import admission
from tests.helpers import paths

SRC = str(paths.SRC)  # this checkout's gpuflame, in every child


def said_lost(stderr: str) -> list[str]:
    prefix = "gpuflame: lost: "
    return [line.removeprefix(prefix) for line in stderr.splitlines() if line.startswith(prefix)]


def webhook_env(dest: Path, session_dir: Path) -> dict[str, str]:
    """The literal variables the webhook sets in a container, with /gpuflame moved to ``dest``."""
    review = {
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"kind": "Pod"},
            "object": {
                "metadata": {"annotations": {"gpuflame.io/inject": "true", "gpuflame.io/backend": "torch"}},
                "spec": {"containers": [{"name": "main", "image": "x"}]},
            },
        },
    }
    ops = json.loads(base64.b64decode(admission.review(review)["response"]["patch"]))
    [env_op] = [op for op in ops if op["path"] == "/spec/containers/0/env"]
    env = {v["name"]: v["value"].replace(admission.MOUNT, str(dest)) for v in env_op["value"] if "value" in v}
    env["GPUFLAME_SESSION_DIR"] = str(session_dir)
    env.pop("GPUFLAME_CACHE_DIR")  # the compiled hook's usual cache: a pod compiles once into its volume, not here
    return env
