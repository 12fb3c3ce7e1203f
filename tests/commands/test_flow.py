"""The main job (`nanokpu flow`): every step runs and the summary says what it did."""


from nanokpu import cli


def test_flow_without_synthesis(capsys):
    assert cli.main(["flow", "--no-synth", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "== [1/4] golden model" in out and "== [3/4] simulate" in out
    assert "bit-exact with the golden integer block" in out
    assert "generated" in out and "rtl/tiny/" in out
    assert "synthesis skipped" in out


def test_flow_with_synthesis(capsys):
    assert cli.main(["flow"]) == 0
    out = capsys.readouterr().out
    assert "== [4/4] synthesize" in out and "synthesized for ecp5-25f" in out
    assert "Fmax" in out and "does not fit" not in out  # placed and routed on tiny's own part
