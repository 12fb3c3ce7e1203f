"""``nanokpu report-errors``: the integer-vs-float error table (docs/errors.md)."""

from __future__ import annotations

from golden import errors
from nanokpu.commands import DOCS
from nanokpu.commands.args import out_file, seed
from nanokpu.config import profile

DOC = DOCS / "errors.md"


def render(profiles: list[str], seed: int) -> str:
    parts = ["# Integer path against the float path", "",
             f"Made by `nanokpu report-errors` (seed {seed}). Each op of `golden/intops.py` is "
             "measured against its float64 formula from `golden/k3.py`; `bound` is the documented "
             "bound that `tests/golden/test_errors.py` asserts. The activation rows cover every "
             "representable input.", ""]
    for name in profiles:
        cfg = profile(name)
        parts += [f"## Profile `{name}`", "", errors.format_table(errors.op_errors(cfg, seed)), ""]
    parts += ["## End to end: one LatentMoE block (32 tokens, random weights)", "",
              "| profile | cosine | max abs error | max error / max abs y | rms rel error "
              "| same expert set | cosine, same-set tokens |", "|---|---|---|---|---|---|---|"]
    for name in profiles:
        e = errors.block_errors(profile(name), seed)
        parts.append(f"| {name} | {e['cosine']:.5f} | {e['max_abs']:.3g} | {e['max_rel']:.3g} "
                     f"| {e['rms_rel']:.3g} | {e['routing_agreement']:.1%} | {e['cosine_same_routing']:.5f} |")
    parts += ["", "Tokens whose scores are near a tie between two experts can route differently "
              "after int8 quantisation of x and W_r; such a token's output differs by a whole "
              "expert's contribution, which dominates the maximum error of the larger profile.", ""]
    parts += ["## End to end: Attention Residuals (256 tokens, random candidates and query)", "",
              "The deepest layer's candidates (embedding, one per block, P), `V_n ~ N(0, 4^n / 4)` in the "
              "act format, query `q ~ N(0, 4 / d)`; `golden/attn_res.py` against `k3.attn_res` on the same "
              "candidates. Keys take RMSNorm's output format `Q<out_width>.<norm_frac>`: an element beyond "
              "`2^(out_width-1-norm_frac)` times its row's RMS saturates.", "",
              "| profile | candidates | cosine | max abs error | max error / max abs h | max weight error |",
              "|---|---|---|---|---|---|"]
    for name in profiles:
        cfg = profile(name)
        e = errors.attn_res_errors(cfg, seed)
        parts.append(f"| {name} | {cfg.attnres_candidates} | {e['cosine']:.6f} | {e['max_abs']:.3g} "
                     f"| {e['max_rel']:.3g} | {e['weights_max_abs']:.3g} |")
    parts += mixer_section(
        "KDA (decode form, `golden/kda.py`)",
        "The ops the integer KDA adds, then the whole mixer (`kda_int` against `k3.kda`, 64 tokens, weights from "
        "`k3.init_kda`, `x ~ N(0, 1)`, input quantisation counted). The state `S` is `Q<2 act_width>.<2 act_frac>`; "
        "`state max` is its largest element after the last token. `tests/golden/test_kda.py` asserts the rows and "
        "the end-to-end values.",
        errors.kda_op_errors, errors.kda_errors, [*END_TO_END, "state_max"], profiles, seed)
    parts += mixer_section(
        "End to end: MLA without positions (32 tokens, random weights, one causal call)",
        "`golden/mla.py` against `k3.mla`, `x ~ N(0, 1)` quantised to int8: int8 projections, RMSNorm with weight, "
        "online softmax over the keys in sequence order, sigmoid gate. First the read-out that `ATTEND` computes "
        "(`golden.errors.mla_op_errors`: `o` in v units, then the gated int8 output), each bound derived from "
        "exp_q's error at every argument; `tests/golden/test_errors.py` asserts them.",
        errors.mla_op_errors, errors.mla_errors, END_TO_END, profiles, seed)
    parts += layer_section(profiles, seed)
    parts.append("")
    return "\n".join(parts)


def layer_section(profiles: list[str], seed: int) -> list[str]:
    """The whole-layer rows: ``golden.layer.layer_int`` against ``k3.layer``, one row per layer kind."""
    parts = ["", "## End to end: one layer (32 tokens, random weights, `golden/layer.py`)", "",
             "`layer_int` against `k3.layer` on the same act-format inputs (`P` and the representatives `Bl` "
             "of the blocks started before `L`, each `N(0, 1)`), calibrated on them: Attention Residuals, "
             "RMSNorm with weight into `Q<out_width>.<norm_frac>` (the mixer's and the FFN's int8 input), "
             "mixer, saturating residual adds in the act format, FFN. `update cosine` is the cosine of what "
             "the layer adds to the `P` it carries on. Errors compound: the mixer's error moves the FFN's "
             "input; an element beyond `2^(out_width-1-norm_frac)` times its row's RMS saturates in the "
             "RMSNorm output; in the LatentMoE layers (KDA, MLA) the largest errors are tokens that the "
             "integer router sends to another expert set, as in the block rows. "
             "`tests/golden/test_layer.py` asserts the rows.", "",
             "| profile | layer | L | cosine | update cosine | max abs error | max error / max abs P | rms rel error |",
             "|---|---|---|---|---|---|---|---|"]
    for name in profiles:
        cfg = profile(name)
        for kind, L in errors.layer_cases(cfg).items():
            e = errors.layer_errors(cfg, L, seed)
            parts.append(f"| {name} | {kind} | {L} | {e['cosine']:.5f} | {e['update_cosine']:.5f} "
                         f"| {e['max_abs']:.3g} | {e['max_rel']:.3g} | {e['rms_rel']:.3g} |")
    return parts


#: The end-to-end columns of a mixer's table: key of golden.block.block_error -> (heading, format).
COLUMNS = {"cosine": ("cosine", "{:.5f}"), "max_abs": ("max abs error", "{:.3g}"),
           "max_rel": ("max error / max abs y", "{:.3g}"), "rms_rel": ("rms rel error", "{:.3g}"),
           "state_max": ("state max", "{:.3g}")}
END_TO_END = ["cosine", "max_abs", "max_rel", "rms_rel"]


def mixer_section(heading: str, intro: str, op_errors, end_to_end, columns: list[str], profiles: list[str],
                  seed: int) -> list[str]:
    """A mixer's rows: its ops per profile (``op_errors(cfg, seed)``, :class:`golden.errors.OpError`
    rows), then the mixer end to end (``end_to_end(cfg, seed)``'s ``columns``, keys of :data:`COLUMNS`)."""
    parts = ["", f"## {heading}", "", intro, ""]
    for name in profiles:
        parts += [f"### Profile `{name}`", "", errors.format_table(op_errors(profile(name), seed)), ""]
    parts += ["| profile | " + " | ".join(COLUMNS[c][0] for c in columns) + " |", "|---|" + "---|" * len(columns)]
    for name in profiles:
        e = end_to_end(profile(name), seed)
        parts.append(f"| {name} | " + " | ".join(COLUMNS[c][1].format(e[c]) for c in columns) + " |")
    return parts


def add_arguments(parser) -> None:
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--out", type=out_file, default=DOC)


def run(args) -> int:
    text = render(["tiny", "small"], args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"wrote {args.out}")
    return 0
