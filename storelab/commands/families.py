"""``storelab families``: what storelab reads and runs, from the registries (``storelab.checkpoint.catalog``).

Per family: its transformers model types, the GGUF architectures read into them, the store kinds it builds,
whether its weights load and run, and the oracle its tests hold it to. ``--markdown`` prints the page
``docs/families.md`` is; ``--json`` one document."""

from __future__ import annotations

import typer

from storelab.console import console, emit_json, table


def register(app: typer.Typer) -> None:
    @app.command()
    def families(
        markdown: bool = typer.Option(False, "--markdown", help="Print the Markdown page (docs/families.md)."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """The checkpoint families read (config.json model types, GGUF architectures), their stores, what runs."""
        from storelab.checkpoint.catalog import catalog, gguf_only, markdown as page

        if markdown and json_:
            from storelab import options as opt

            opt.fail("--markdown and --json: give at most one")
        if markdown:
            typer.echo(page(), nl=False)
            return
        rows = catalog()
        if json_:
            emit_json({"families": [r.record() for r in rows],
                       "gguf_without_family": [{"architecture": a, "model_type": t} for a, t in gguf_only()]})
            return
        console.print(table(f"Families read: {len(rows)} ({sum(len(r.model_types) for r in rows)} model types, "
                            f"{sum(len(r.gguf) for r in rows)} GGUF architectures)",
                            ["family", "model types", "GGUF", "stores", "runs"],
                            [[r.family, ", ".join(r.model_types), ", ".join(r.gguf) or "-", ", ".join(r.stores),
                              "yes" if r.runs else f"no: {r.refused}"] for r in rows]))
        console.print("Tested against: transformers 5.23's tiny model of each family (logits, cache bytes, "
                      "parameters) unless `--json` says otherwise; `storelab families --markdown` is "
                      "docs/families.md.", highlight=False)
