"""A mistyped flag is refused by its command, naming the flag it was likely meant to be."""

from __future__ import annotations

import pytest

from gpuflame.cli.main import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["run", "--bakend", "torch", "x.py"],
            "gpuflame run: error: unrecognized arguments: --bakend (did you mean --backend?)",
        ),
        (["report", "--tpye", "x"], "gpuflame report: error: unrecognized arguments: --tpye (did you mean --type?)"),
        (["report", "x", "--hide-trampolnes"], "(did you mean --hide-trampolines?)"),
    ],
)
def test_a_typo_names_the_flag_it_was_meant_to_be(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_a_flag_like_nothing_known_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["report", "x", "--zzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzz" in err and "did you mean" not in err
