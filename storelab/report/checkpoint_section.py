"""The report's checkpoint section (``storelab report --checkpoint DIR``): the essay's measurements on
the user's own model folder, beside the essay's figures.

The probes on text (``storelab.probes.on_folder``: state_swap, keep_one, forgetting, and selection
and mhc where the model has those stores) run on the shipped prompt sets through the folder's
tokenizer, and the forgetting probe's weights-only estimate reads the gate tensors
(``storelab.probes.gate_weights``). ``--stream`` reads each layer's weights during its call.

Each trained-model claim of the essay gets this model's measured value. The essay's figures are
measurements on particular released models (Qwen3.5-4B, Kimi Linear, DeepSeek-V4-Flash). A claim is
"reproduced" when this model falls within the essay's range where the essay gives one (swap
fractions), otherwise within ``TOLERANCE`` of the single figure, and only from a figure its probe
checked (``storelab.probes.validity``: the model answers the prompts above chance, the swap moves
the answer); otherwise it is "not measured", with the check's reason. A probe that does not apply
(no recurrent layer, no mHC) leaves its claims "not checkable", with the reason.
"""

from __future__ import annotations

from storelab.report.core import TRAINED_TOLERANCE, Claim, Context, SectionResult, Table, checked_claim

TOLERANCE = TRAINED_TOLERANCE  # relative, where the essay gives one figure rather than a range
QUICK_N, FULL_N = 6, 32
QUICK_CONTEXTS, FULL_CONTEXTS = (256,), (1024,)


def _claims(name: str, results: dict, skipped: dict, gates: dict | None) -> list[Claim]:
    S = f"checkpoint: {name}"
    out: list[Claim] = []

    def claim(probe: str, text: str, essay: float, get, *, part: str | None = None,
              within: tuple[float, float] | None = None, how: str = "") -> None:
        """A claim on ``probe``'s figure, checked by the probe's validity (keep_one: its ``part``'s)."""
        r = results.get(probe)
        value = None if r is None else get(r)
        check = None if r is None else (r.get("checks", {}).get(part) if part else r.get("validity"))
        why = how if r is not None else f"{probe} did not run: {skipped.get(probe, 'no value')}"
        out.append(checked_claim(S, text, essay, value, check, within=within, tolerance=TOLERANCE, reason=why))

    claim("state_swap", "the attention caches carry the asked value (state swap moves 96-100 %)", 0.98,
          lambda r: r.get("cache_fraction"), within=(0.96, 1.0),
          how="swap of all caches after the prompt's second-to-last token")
    claim("state_swap", "the recurrent states carry almost none of it (0.2-3.6 %)", 0.019,
          lambda r: r.get("recurrent_fraction"), within=(0.002, 0.036), how="swap of all recurrent states")
    claim("keep_one", "with the caches alone the value is retrieved (89 %)", 0.89,
          lambda r: r["cache_only"]["retrieval"], part="retrieval")
    claim("keep_one", "with the states alone the answer keeps its language (70 % compliance)", 0.70,
          lambda r: r["state_only"]["compliance"], part="compliance")
    claim("forgetting", "the recurrent heads' median half-life is about 24 tokens", 24.0,
          lambda r: r.get("median_half_life"), how="mean gate over the shipped documents")
    for key, essay, text in (("identity_first_half", 0.414, "mHC's mix as the identity in the first half: +41 %"),
                             ("identity_second_half", 0.019, "... in the second half: +1.9 %")):
        claim("mhc", f"{text} perplexity", essay, lambda r, k=key: r["conditions"][k]["perplexity_change"],
              how="on the shipped documents")
    # the weights-only estimate runs no model: it counts where the same model's forgetting probe found it learned
    frac = None if gates is None else gates.get("kda_mixing_fraction")
    forget = results.get("forgetting")
    out.append(checked_claim(S, "98 % of KDA heads mix fast and slow channels (from the weights)", 0.98, frac,
                             None if forget is None else forget.get("validity"), tolerance=TOLERANCE,
                             reason="gate tensors at x = 0" if frac is not None
                             else "no KDA layer (a decay per key channel) in this model"))
    return out


def checkpoint_section(ctx: Context) -> SectionResult:
    from storelab.probes.gate_weights import gate_spectra
    from storelab.probes.on_folder import TEXT_PROBES, open_text_model, run_text_probes
    from storelab.probes.source import placement
    from storelab.report.probe_rows import cell, probe_rows

    folder = ctx.checkpoint
    model, tok = open_text_model(folder, stream=ctx.stream, device=ctx.device, dtype=ctx.dtype)
    where = placement(model, ctx.device)
    n = QUICK_N if ctx.quick else FULL_N
    contexts = list(QUICK_CONTEXTS if ctx.quick else FULL_CONTEXTS)
    results, skipped = run_text_probes(model, tok, list(TEXT_PROBES), prompts=None, records=None, n=n,
                                       chat=False, explicit=False, contexts=contexts)
    try:
        gates = gate_spectra(folder)
    except ValueError as e:  # no recurrent layer with a decay gate
        gates, skipped["forgetting (weights only)"] = None, str(e)
    name = model.cfg.name
    tables = [Table(f"{nm}: {name} (essay: {r['essay']['source']})", ["figure", "ours", "essay"], probe_rows(nm, r))
              for nm, r in results.items()]
    if gates is not None:   # as measured as the forgetting probe on text found it (the same model)
        check = (results.get("forgetting") or {}).get("validity")
        tables.append(Table(f"forgetting from the weights alone: {name}", ["figure", "ours", "essay"],
                            [["median half-life at x = 0 (tokens)", cell(gates["median_half_life"], check), ""],
                             ["KDA heads mixing fast and slow channels", None if gates["kda_mixing_fraction"] is None
                              else cell(gates["kda_mixing_fraction"], check), 0.98],
                             ["bytes read (headers + gates)", gates["read"]["bytes_read"], ""]]))
    if skipped:
        tables.append(Table("probes that did not apply", ["probe", "why"], [[k, v] for k, v in skipped.items()]))
    text = (f"The essay's measurements of what trained hybrids keep where, run on {folder} ({name}, "
            f"{model.cfg.mix()}) with the shipped prompt sets through its own tokenizer ({n} prompts per probe"
            f"{', streamed layer by layer' if ctx.stream else ''}, {where['dtype']} on {where['device']}). The essay's figures were measured on other "
            "models; the claims below hold this model to them, within the essay's range where it gives one.")
    unmeasured = {nm: r["reason"] for nm, r in results.items() if r.get("valid") is False}
    if unmeasured and len(unmeasured) == sum("valid" in r for r in results.values()):
        text += " No probe found an effect to measure on this model, so none of its fractions is printed: "
    elif unmeasured:
        text += " Not measured on this model, so without fractions: "
    text += "; ".join(f"{nm} ({why})" for nm, why in unmeasured.items()) + ("." if unmeasured else "")
    return SectionResult(text=text, tables=tables, claims=_claims(name, results, skipped, gates),
                         data={"checkpoint": str(folder), "model": name, **where, "results": results, "skipped": skipped,
                               "weights_only": gates})
