"""``opforge quantize MODULE:FACTORY --scheme S [--calibration LIST] -o model.opf``.

    check the options (compile specs, kernel sets) → load the factory → calibration samples
    (LIST: one sample per line, its input .npy paths separated by spaces, as ``opforge run
    --input-list``; without it the example inputs, with a warning) → quantize (PT2E) →
    report (per node; SQNR and max abs error against the float model, on the calibration
    samples and on ``--eval``'s held-out ones) → export (with ``--backend``) → write
"""

from __future__ import annotations

import json

import click

from opforge.cli.export_cmd import load_factory, methods_from_factory, with_dims
from opforge.cli.run_cmd import _read_input_list, _read_npy
from opforge.errors import ExportError

__all__ = ["quantize"]

_API = "`opforge quantize`"
_API_NAME = "opforge quantize"
_SCHEMES = ("8a8w", "16a16w", "16a8w", "16a4w", "16a4w_block", "8a4w",  # opforge.quantize.SCHEMES
            "w8", "w8_block", "w4",
            "8da8w", "8da4w")  # opforge.quantize.dynamic.DYNAMIC_SCHEMES: a module swap, no PT2E


def _samples(path: str, option: str) -> list[tuple]:
    import torch

    return [tuple(torch.from_numpy(_read_npy(p, _API_NAME, option).copy()) for p in line)
            for line in _read_input_list(path, _API_NAME, option)]


def _kernel_sets(kernels: tuple[str, ...]) -> list[str] | None:
    """The kernel sets to check the program against, checked now (before calibrating) and
    completed: a quantized program needs quantize/dequantize kernels, which the portable
    set has, so a native library given alone is joined with it."""
    if not kernels:
        return None
    from opforge.errors import ExportError
    from opforge.export.kernel_sets import resolve_kernels

    sets = list(kernels)
    if not {"portable", "aten"} & set(sets):
        sets.append("portable")
        click.echo(f"note: --kernels {' '.join(kernels)}: the portable set is added for the "
                   "quantize/dequantize ops and the ATen ops your library does not serve", err=True)
    try:
        resolve_kernels(sets)
    except ExportError as exc:
        raise click.ClickException(str(exc).replace("opforge.export.export", "opforge quantize")) from None
    return sets


@click.command("quantize")
@click.argument("factory")
@click.option("--scheme", type=click.Choice(_SCHEMES), default="8a8w", show_default=True,
              help="Activation/weight bits (docs/quantization.md). Weight-only (float "
                   "activations, no calibration needed): w8 int8 per channel, w8_block int8 "
                   "per group, w4 int4 per group along the input channels. Dynamic int8 "
                   "activations (quantized at run time per block of 32, as llama.cpp's Q8_0/"
                   "Q4_0; no calibration): 8da8w int8 weights, 8da4w int4 weights.")
@click.option("--group-size", type=click.IntRange(min=1), metavar="N",
              help="Block along the input channels of block-wise weights (w4, w8_block, "
                   "16a4w_block, 8da8w, 8da4w): 32 (the default of w4 and the 8da schemes, as "
                   "Q4_0), 64, 128; must divide them.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False), metavar="LIST",
              help="Calibration samples: one per line, its input .npy paths separated by spaces "
                   "(not needed by the weight-only schemes w8, w8_block, w4).")
@click.option("--eval", "eval_list", type=click.Path(exists=True, dir_okay=False), metavar="LIST",
              help="Held-out samples (same format) to report accuracy on, besides calibration's.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Program file to write.")
@click.option("--per-tensor", is_flag=True, help="Per-tensor weights (default: per channel).")
@click.option("--symmetric", is_flag=True, help="Symmetric activations (zero point 0).")
@click.option("--observer", type=click.Choice(["minmax", "moving_average", "histogram"]),
              default="minmax", show_default=True, help="Activation observer.")
@click.option("--discard-op", "discard_ops", multiple=True, metavar="OP",
              help="Leave this op in floating point (e.g. aten::softmax). Repeatable.")
@click.option("--kernels", "kernels", multiple=True, metavar="SET",
              help="Kernel set(s) to check the program against, as `opforge export --kernels` "
                   "(a native library alone is joined with the portable set).")
@click.option("--backend", "backends", multiple=True, metavar="NAME",
              help="Delegate to this backend (e.g. cpu: 8a8w runs on oneDNN int8). Repeatable.")
@click.option("--compile-spec", "compile_specs", multiple=True, metavar="KEY=VALUE",
              help="A compile spec for the backend(s), e.g. num_threads=2. Repeatable.")
@click.option("--op-packages", "op_packages", type=click.Path(dir_okay=False), metavar="FILE",
              help="JSON/YAML list of op packages (OpPackageInfo) for the backend.")
@click.option("--dim", "dims", multiple=True, metavar="INPUT:DIM:NAME:MIN:MAX",
              help="Make dimension DIM of input number INPUT dynamic, named NAME, in [MIN, MAX], "
              "as `opforge export --dim`: captured symbolic, calibration samples may differ "
              "there, and the program takes those sizes. Repeatable.")
@click.option("--no-debug-handles", "no_debug_handles", is_flag=True,
              help="Leave out the debug table (as `opforge export --no-debug-handles`).")
@click.option("-q", "--quiet", is_flag=True, help="No progress, only errors and the report.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def quantize(factory: str, scheme: str, group_size: int | None, calibration: str | None,
             eval_list: str | None,
             output: str, per_tensor: bool, symmetric: bool, observer: str,
             discard_ops: tuple[str, ...], kernels: tuple[str, ...], backends: tuple[str, ...],
             compile_specs: tuple[str, ...], op_packages: str | None, dims: tuple[str, ...],
             no_debug_handles: bool, quiet: bool, as_json: bool) -> None:
    """Quantize FACTORY (MODULE:FUNCTION returning (model, example_inputs)) and write a program."""
    import warnings

    from rich.console import Console

    from opforge.cli.export_cmd import _compile_specs
    from opforge.cli.tables import table_console

    status_console = Console(stderr=True, quiet=quiet or as_json)
    # everything that can be wrong with the command is found before calibrating
    specs = _compile_specs(compile_specs, op_packages, backends)
    kernel_sets = _kernel_sets(kernels)
    with status_console.status("importing torch and torchao") as status:
        from opforge.program import save
        from opforge.quantize import Quantizer, QuantizeError
        from opforge.quantize import quantize as quantize_model

        status.update(f"importing {factory}")
        ((method, entry),) = methods_from_factory(factory, load_factory(factory)(), ()).items()
        model, inputs, dynamic = (tuple(entry) + (None,))[:3]  # the factory's dynamic_shapes
        if dims:
            try:
                _, inputs, dynamic = with_dims(method, (model, inputs), dims, "`opforge quantize`")
            except ExportError as exc:
                raise click.ClickException(str(exc)) from None
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        if scheme in ("8da8w", "8da4w"):
            _check_dynamic_options(scheme, calibration=calibration, eval=eval_list,
                                   per_tensor=per_tensor, symmetric=symmetric,
                                   observer=observer != "minmax", discard_op=discard_ops)
            program, swapped = _export_dynamic(model, inputs, dynamic, scheme, group_size,
                                               status, kernels=kernel_sets,
                                               backends=list(backends), compile_specs=specs,
                                               debug_handles=not no_debug_handles)
            status.update(f"writing {output}")
            save(program, output)
            _print_dynamic(program, output, scheme, swapped, backends, as_json)
            return
        status.update("reading samples")
        samples = _samples(calibration, "--calibration") if calibration else None
        held_out = _samples(eval_list, "--eval") if eval_list else None
        try:
            quantizer = Quantizer(scheme, per_channel_conv=not per_tensor,
                                  per_channel_linear=not per_tensor, act_symmetric=symmetric,
                                  act_observer=observer, group_size=group_size)
        except QuantizeError as exc:
            raise click.ClickException(str(exc)) from None
        if discard_ops:
            quantizer.add_discard_ops(discard_ops)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            try:
                # the float model is needed again only to evaluate: without --eval its
                # weights are freed before export (quantize's keep_float_model)
                result = quantize_model(model, inputs, quantizer=quantizer, calibration=samples,
                                        on_step=status.update, dynamic_shapes=dynamic,
                                        keep_float_model=held_out is not None)
                del model, entry
                if held_out is not None:
                    status.update(f"evaluating on {len(held_out)} held-out sample(s)")
                    result.evaluate(held_out)
            except QuantizeError as exc:
                raise click.ClickException(str(exc)) from None
        status.update("exporting" + (f" (backends: {', '.join(backends)})" if backends else ""))
        program = result.export(kernels=kernel_sets, backends=list(backends), compile_specs=specs,
                                debug_handles=not no_debug_handles)
        status.update(f"writing {output}")
        save(program, output)
    for warning in caught:
        if "calibration" in str(warning.message):
            click.echo(f"warning: {warning.message}", err=True)
    if as_json:
        data = result.report.to_dict()
        data["output"] = output
        if backends:
            from opforge.export import delegation_report

            data["delegation"] = delegation_report(program)
        click.echo(json.dumps(data, indent=2))
        return
    console = table_console()
    result.report.print_table(console)
    from opforge.program.describe import data_sizes, describe

    # the same breakdown as `opforge inspect`: the segments summed would count the delegate
    # blobs and the named data they share as "constants"
    console.print(f"wrote {output} ({scheme}, {data_sizes(describe(program))})")
    if backends:
        from opforge.cli.delegation_view import print_delegation
        from opforge.export import delegation_report

        print_delegation(console, delegation_report(program), explain=False)


def _check_dynamic_options(scheme: str, **given) -> None:
    """The dynamic schemes swap modules and read no samples: an option of the PT2E flow is
    refused by name rather than ignored."""
    used = [name.replace("_", "-") for name, value in given.items() if value]
    if used:
        raise click.ClickException(
            f"{_API}: --{', --'.join(used)} — not used by --scheme {scheme} (activations are "
            "quantized at run time from their own values; weights per block) — valid with it: "
            "--group-size, --backend, --kernels, --dim — fix: drop the option")


def _export_dynamic(model, inputs, dynamic, scheme, group_size, status, **export_kw):
    """(program, {"linears": n, "embeddings": m}) of ``model`` with its linears and tables
    swapped for ``scheme``'s (opforge.quantize.dynamic), exported with 4-bit weights packed."""
    import torch

    from opforge.errors import ExportError
    from opforge.export import export
    from opforge.quantize import QuantizeError
    from opforge.quantize.dynamic import DynamicQuantLinear, QuantEmbedding, quantize_dynamic
    from opforge.quantize.packing import pack_4bit_weights

    status.update(f"quantizing ({scheme})")
    try:
        # in place: the factory's model is not used again, and each float weight goes once
        # its integers exist
        swapped_model = quantize_dynamic(model, scheme, block=group_size or 32, inplace=True)
    except (QuantizeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    swapped = {"linears": sum(isinstance(m, DynamicQuantLinear) for m in swapped_model.modules()),
               "embeddings": sum(isinstance(m, QuantEmbedding) for m in swapped_model.modules())}
    if not swapped["linears"]:
        raise click.ClickException(
            f"{_API}: --scheme {scheme} — found no nn.Linear in the model — valid: a model with "
            "linear layers — fix: pick a PT2E scheme (e.g. 8a8w) for other models")
    status.update("exporting" + (f" (backends: {', '.join(export_kw['backends'])})"
                                 if export_kw["backends"] else ""))
    try:
        with torch.no_grad():
            program = export(swapped_model.eval(), inputs, dynamic_shapes=dynamic, **export_kw)
    except ExportError as exc:
        raise click.ClickException(str(exc).replace("opforge.export.export", _API_NAME)) from None
    return pack_4bit_weights(program), swapped


def _print_dynamic(program, output: str, scheme: str, swapped: dict, backends, as_json: bool) -> None:
    from opforge.program.describe import data_sizes, describe

    if as_json:
        data = {"output": output, "scheme": scheme, **swapped}
        if backends:
            from opforge.export import delegation_report

            data["delegation"] = delegation_report(program)
        click.echo(json.dumps(data, indent=2))
        return
    from opforge.cli.tables import table_console

    console = table_console()
    console.print(f"wrote {output} ({scheme}: {swapped['linears']} linear(s) on dynamic int8 "
                  f"activations, {swapped['embeddings']} table(s); {data_sizes(describe(program))})")
    if backends:
        from opforge.cli.delegation_view import print_delegation
        from opforge.export import delegation_report

        print_delegation(console, delegation_report(program), explain=False)
