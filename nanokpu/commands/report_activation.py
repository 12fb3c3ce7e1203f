"""``nanokpu report-activation``: docs/activation.md and docs/activation_gate.png.

Formats, table sizes, latency, error against the float64 formulas (:mod:`golden.k3`) and the
ECP5 cost after Yosys synthesis (:func:`fpga.flow.synthesize`) of the activation units
(:class:`~nanokpu.units.situ.Situ`, :class:`~nanokpu.units.sigmoid.Sigmoid`), for the configs of
:data:`REPORT_CONFIGS`. The error functions here are also what ``tests/test_situ.py`` and
``tests/test_sigmoid.py`` assert against the documented bounds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from golden import intops, k3
from nanokpu.commands import DOCS
from nanokpu.commands.args import out_dir
from nanokpu.config import KpuConfig, profile
from nanokpu.units.pwl import error_bound, out_range, range_shape
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ, situ_error_bound, situ_h_range

__all__ = ["REPORT_CONFIGS", "SYNTH_RUNS", "error_stats", "factor_errors", "situ_errors", "render", "plot_gate"]


#: Report configs: K3's betas on one lane (``tiny``) and four (``small``), and betas 2/8.
REPORT_CONFIGS: dict[str, KpuConfig] = {
    "tiny": profile("tiny"),
    "small": profile("small"),
    "tiny, beta 2/8": profile("tiny", beta1=2.0, beta2=8.0),
}

#: Relative errors are taken where ``|exact| >= full scale / REL_FLOOR`` (near 0 they are
#: meaningless: an absolute bound of 1.5 LSB is all a fixed-point format can promise).
REL_FLOOR = 16


def _all_inputs(width: int) -> np.ndarray:
    """Every signed ``width``-bit integer, ascending."""
    return np.arange(-(1 << (width - 1)), 1 << (width - 1), dtype=np.int64)


def error_stats(approx, exact, full_scale: float, bound: float) -> dict:
    """``max_abs``, ``max_rel`` (where ``|exact| >= full_scale / REL_FLOOR``) and the bounds."""
    approx, exact = np.asarray(approx, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    err = np.abs(approx - exact)
    floor = full_scale / REL_FLOOR
    big = np.abs(exact) >= floor
    return {"max_abs": float(err.max()), "max_rel": float(np.max(err[big] / np.abs(exact[big]))),
            "bound": bound, "rel_bound": bound / floor, "rel_floor": floor, "n": int(err.size)}


def factor_errors(cfg: KpuConfig) -> dict[str, dict]:
    """Error of the gate and up tables over every ``act_width``-bit input and of the sigmoid over
    every logit (``router_logit_width`` bits, ``router_logit_frac`` fractional)."""
    xs, logits = _all_inputs(cfg.act_width), _all_inputs(cfg.router_logit_width)
    real = xs / 2.0 ** cfg.act_frac
    cases = {
        "gate": (intops.gate_table(cfg), xs, k3.situ_gate(real, cfg.beta1), cfg.beta1),
        "up": (intops.up_table(cfg), xs, k3.situ_up(real, cfg.beta2), cfg.beta2),
        "sigmoid": (intops.sigmoid_table(cfg), logits, k3.sigmoid(logits / 2.0 ** cfg.router_logit_frac), 1.0),
    }
    return {name: {**error_stats(table(x) * 2.0 ** -table.out_frac, exact, scale, error_bound(table)),
                   "lsb": 2.0 ** -table.out_frac}
            for name, (table, x, exact, scale) in cases.items()}


def situ_errors(cfg: KpuConfig, partners: int = 128, seed: int = 0) -> dict:
    """Error of ``h`` on every ``g`` with ``partners`` values of ``u`` and every ``u`` with
    ``partners`` values of ``g`` (random, plus both ends of the input range)."""
    rng = np.random.default_rng(seed)
    xs = _all_inputs(cfg.act_width)
    other = np.concatenate([xs[[0, -1]], rng.choice(xs, partners - 2, replace=False)])
    g = np.concatenate([np.repeat(xs, partners), np.tile(other, xs.size)])
    u = np.concatenate([np.tile(other, xs.size), np.repeat(xs, partners)])
    h = intops.situ_q(g, u, cfg) * 2.0 ** -cfg.h_frac
    exact = k3.situ_glu(g / 2.0 ** cfg.act_frac, u / 2.0 ** cfg.act_frac, cfg)
    return {**error_stats(h, exact, cfg.situ_bound, situ_error_bound(cfg)), "lsb": 2.0 ** -cfg.h_frac}


# ----------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------
def _table_row(name: str, table: intops.PwlTable) -> str:
    value = range_shape(min(table.values), max(table.values))
    slope = range_shape(min(0, *table.slopes), max(0, *table.slopes))
    lo, hi = out_range(table)
    words = table.n_seg      # the last breakpoint's value is a constant in the logic
    x_lo, x_hi = table.x0, table.x0 + (table.n_seg << table.seg_shift)
    return (f"| {name} | [{x_lo}, {x_hi}] | {table.n_seg} x {1 << table.seg_shift} | {words} "
            f"| {value.width} + {slope.width} | {words * (value.width + slope.width)} | [{lo}, {hi}] |")


def _formats(key: str, cfg: KpuConfig) -> list[str]:
    lo, hi = situ_h_range(cfg)
    return [
        f"### `{key}`: beta1 = {cfg.beta1:g}, beta2 = {cfg.beta2:g}, act_lanes = {cfg.act_lanes}", "",
        f"Inputs `Q{cfg.act_width}.{cfg.act_frac}`; factors `situ_frac = {cfg.situ_frac}`; "
        f"h `Q{cfg.h_width}.{cfg.h_frac}` (product rounded by {2 * cfg.situ_frac - cfg.h_frac} bits, "
        f"`{cfg.rounding}`); scores `score_frac = {cfg.score_frac}` ({cfg.score_width} bits unsigned); "
        f"`pwl_guard = {cfg.pwl_guard}`.", "",
        f"h over all 2^{2 * cfg.act_width} input pairs lies in [{lo}, {hi}] LSB = "
        f"[{lo / 2 ** cfg.h_frac:g}, {hi / 2 ** cfg.h_frac:g}]; beta1*beta2 = {cfg.situ_bound:g} = "
        f"{cfg.situ_bound * 2 ** cfg.h_frac:g} LSB; signed {cfg.h_width} bits hold "
        f"+-{(1 << (cfg.h_width - 1)) - 1}: no saturation logic.", "",
        "| table | domain (input LSB) | segments x width | words | value + slope bits | ROM bits "
        "| output range (LSB) |",
        "|---|---|---|---|---|---|---|",
        _table_row("gate", intops.gate_table(cfg)),
        _table_row("up", intops.up_table(cfg)),
        _table_row("sigmoid", intops.sigmoid_table(cfg)),
        "",
    ]


def _errors(cfg: KpuConfig) -> list[str]:
    rows = ["| function | inputs | max abs error | in LSB | bound (LSB) | max rel error "
            "| rel bound | rel taken where |", "|---|---|---|---|---|---|---|---|"]
    stats = factor_errors(cfg)
    stats["h = gate * up"] = situ_errors(cfg)
    for name, s in stats.items():
        inputs = f"all {s['n']}" if name != "h = gate * up" else f"{s['n']} pairs"
        rows.append(f"| {name} | {inputs} | {s['max_abs']:.3g} | {s['max_abs'] / s['lsb']:.2f} "
                    f"| {s['bound'] / s['lsb']:.2f} | {s['max_rel']:.2e} | {s['rel_bound']:.2e} "
                    f"| \\|exact\\| >= {s['rel_floor']:g} |")
    return rows + [""]


#: (report config, fpga.flow target) pairs synthesized for the cost table.
SYNTH_RUNS = [(key, "ecp5-85f") for key in REPORT_CONFIGS] + [("tiny", "up5k")]


def _synthesis(pnr: bool, progress) -> list[str]:
    from fpga.flow import TARGETS, synthesize

    rows = ["| config | target | unit | lanes | latency (cycles) | LUT4 | FF | DSP | BRAM "
            + ("| Fmax (MHz) |" if pnr else "|"),
            "|---|---|---|---|---|---|---|---|---" + ("|---|" if pnr else "|")]
    for key, target in SYNTH_RUNS:
        cfg = REPORT_CONFIGS[key].replace(dsp=TARGETS[target].family)   # as `nanokpu synth` builds it
        slug = key.replace(", ", "_").replace(" ", "").replace("/", "x")
        for unit in (Situ(cfg), Sigmoid(cfg)):
            name = f"act_{type(unit).__name__.lower()}_{slug}"
            rep = synthesize(unit, name, target, pnr=pnr, progress=progress)
            r = rep["resources"]
            row = (f"| {key} | {target} | {type(unit).__name__} | {cfg.act_lanes} | {unit.latency} "
                   f"| {r['lut']} | {r['ff']} | {r['dsp']} | {r['bram']} |")
            rows.append(row + (f" {rep['pnr']['fmax_mhz']} |" if pnr else ""))
    return rows + [""]


def plot_gate(cfg: KpuConfig, path: Path) -> Path:
    """PNG: the fixed-point gate(g) against float64, and its error in LSB, over every input."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = _all_inputs(cfg.act_width)
    g = xs / 2.0 ** cfg.act_frac
    table = intops.gate_table(cfg)
    lsb = 2.0 ** -cfg.situ_frac
    fixed = intops.gate_q(xs, cfg) * lsb
    exact = k3.situ_gate(g, cfg.beta1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(g, exact, lw=2.5, color="0.75", label="float64")
    top.plot(g, fixed, lw=0.9, color="C0", label=f"fixed point (situ_frac = {cfg.situ_frac})")
    breakpoints = (table.x0 + (np.arange(table.n_seg + 1) << table.seg_shift)) / 2.0 ** cfg.act_frac
    top.axvspan(breakpoints[0], breakpoints[-1], color="C1", alpha=0.08,
                label=f"table domain, {table.n_seg} segments")
    top.set_ylabel("gate(g)")
    top.set_title(f"SiTU gate, beta1 = {cfg.beta1:g}: beta1 tanh(g/beta1) sigmoid(g)")
    top.legend(loc="upper left", fontsize=8)
    bottom.plot(g, (fixed - exact) / lsb, lw=0.6, color="C0")
    bound = error_bound(table) / lsb
    for sign in (1, -1):
        bottom.axhline(sign * bound, color="C3", ls="--", lw=0.8)
    bottom.set_ylabel("error (LSB)")
    bottom.set_xlabel(f"g (every Q{cfg.act_width}.{cfg.act_frac} input; flat beyond the table domain)")
    bottom.set_xlim(breakpoints[0] - 4, breakpoints[-1] + 4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(synth: bool = True, pnr: bool = True, progress=None) -> str:
    """The Markdown text of docs/activation.md."""
    parts = [
        "# Activation units: SiTU-GLU and sigmoid", "",
        "Made by `nanokpu report-activation`. RTL: `nanokpu/units/pwl.py` (the piecewise-linear "
        "evaluator), `nanokpu/units/situ.py`, `nanokpu/units/sigmoid.py`; golden: `golden/intops.py` "
        "(`PwlTable`, `fit_pwl`, `situ_q`, `sigmoid_q`). Verified bit for bit on Verilator over "
        "every input of each table and on random and corner (g, u) pairs with random idle and "
        "backpressure (`tests/test_pwl.py`, `tests/test_situ.py`, `tests/test_sigmoid.py`).", "",
        "## Design", "",
        "Each factor is a `PwlTable` fitted at elaboration time from the config (betas, formats, "
        "guard bits): uniform segments of `2**seg_shift` input LSB over the narrowest power-of-two "
        "domain outside which the correctly rounded function is constant (exact flat tails), every "
        "output within 1 LSB of the correctly rounded value (checked exhaustively by `fit_pwl`). "
        "The RTL stores one (value, slope) word per "
        "breakpoint, the last with slope 0, so the top breakpoint needs no special case: "
        "`t = clip(x - x0)`, `i = t >> s`, `y = value[i] + (slope[i] * (t mod 2**s) >> s)`, then one "
        "rounding shift by `pwl_guard` bits. Pipeline: address (1), table read into a register (2, "
        "block RAM outputs are slow), interpolation product (3), sum and rounding (4); SiTU adds "
        "the factor product (5) and its rounding to `h_frac` (6). Data registers have no reset. All "
        "lanes share one table through their own read ports. A stalled output stalls the whole "
        "pipeline (`ready = !valid_out | ready_out`), so full throughput needs no skid buffer.", "",
        f"Latency: SiTU {Situ.latency} cycles, sigmoid {Sigmoid.latency} cycles; one transfer of "
        "`act_lanes` results per cycle.", "",
        "## Formats and tables", "",
    ]
    for key, cfg in REPORT_CONFIGS.items():
        if key != "small":  # small differs from tiny in lanes only
            parts += _formats(key, cfg)
    parts += [
        "## Error against the float64 formula", "",
        "Factors and sigmoid over every input; `h` on every g with 128 values of u and every u with "
        "128 values of g (both ends of the range included). Bounds (asserted by the tests): a table "
        "is within 1.5 LSB (1 LSB from the correctly rounded value, plus that rounding); "
        "`|h - G U| <= (beta1 + e) e + beta2 e + 2**-h_frac / 2` with `e = 1.5 * 2**-situ_frac`. "
        f"Relative error is taken where |exact| >= full scale / {REL_FLOOR} (beta1, beta2, 1 and "
        "beta1*beta2); its bound is the absolute bound over that floor.", "",
    ]
    for key, cfg in REPORT_CONFIGS.items():
        if key != "small":
            parts += [f"### `{key}`", "", *_errors(cfg)]
    parts += ["![fixed-point gate and its error](activation_gate.png)", "",
              "## Notes", "",
              "- The bound `|h| <= beta1*beta2` holds exactly when `beta1 * 2**situ_frac`, "
              "`beta2 * 2**situ_frac` and `beta1*beta2 * 2**h_frac` are integers (K3's 4/25 and 2/8 "
              "are). Otherwise the factors' rounding can push `|h|` a few LSB past it, which the "
              "config's analytic `h_width` check does not see: `Situ` computes the exact range of `h` "
              "from its tables (`situ_h_range`) and refuses an `h_width` that cannot hold it "
              "(`tests/test_situ.py` has such a config).",
              "- The sigmoid takes `act_lanes` logits per cycle; a router wanting `route_lanes` can "
              "build it from `cfg.replace(act_lanes=cfg.route_lanes)`.",
              "- The table holds `n_seg` words: the last breakpoint's value is a constant in the "
              "logic, so a power-of-two `n_seg` fills whole block RAM modes (257 sigmoid words took "
              "4 UP5K blocks, 256 take 2).",
              "- Considered, not done: odd symmetry (`up`, and `sigmoid(-x) = 1 - sigmoid(x)`) halves "
              "those tables in words (`|x|` of the most negative input is the last breakpoint, a "
              "constant: the `up` table would be 512 words, 5 UP5K blocks instead of 9); it needs a "
              "sign-magnitude evaluation in the golden `PwlTable`, bit-exact under every rounding mode.",
              ""]
    if synth:
        parts += ["## FPGA cost", "",
                  "`fpga.flow.synthesize` on the bare unit, built with `dsp` set to the target's family "
                  "as `nanokpu synth` builds it (`proc; flatten; splitnets; synth_ecp5` for the "
                  "LFE5U-85F: DSP = MULT18X18D, BRAM = DP16KD (18 Kbit), the PWL interpolation products "
                  "in the logic; `synth_ice40 -dsp` for the UP5K: DSP = SB_MAC16, BRAM = SB_RAM40_4K "
                  "(4 Kbit), 30 on the part)"
                  + ("; Fmax from nextpnr (ECP5 out of context, speed grade 6, goal 100 MHz; iCE40 "
                     "with register-wrapped ports, goal 30 MHz)." if pnr else "."), "",
                  *_synthesis(pnr, progress)]
    return "\n".join(parts)


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=out_dir, default=DOCS, help="output directory (default: docs/)")
    parser.add_argument("--no-synth", action="store_true", help="skip the Yosys synthesis section")
    parser.add_argument("--no-pnr", action="store_true", help="skip nextpnr (no Fmax column)")


def run(args) -> int:
    plot = plot_gate(REPORT_CONFIGS["tiny"], args.out / "activation_gate.png")
    text = render(synth=not args.no_synth, pnr=not args.no_pnr, progress=print)
    doc = args.out / "activation.md"
    doc.write_text(text)
    print(f"wrote {doc} and {plot}")
    return 0
