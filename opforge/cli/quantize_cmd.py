"""``opforge quantize MODULE:FACTORY --scheme S [--calibration LIST] -o model.opf``.

    load the factory → calibration samples (LIST: one sample per line, its input .npy paths
    separated by spaces, as ``opforge run --input-list``; without it the example inputs,
    with a warning) → quantize (PT2E) → report (per node; SQNR and max abs error against
    the float model) → export → write
"""

from __future__ import annotations

import json

import click

from opforge.cli.export_cmd import load_factory, methods_from_factory
from opforge.cli.run_cmd import _read_input_list, _read_npy

__all__ = ["quantize"]

_API = "`opforge quantize`"
_SCHEMES = ("8a8w", "16a16w", "16a8w", "16a4w", "16a4w_block", "8a4w")  # opforge.quantize.SCHEMES


def _calibration(path: str, example_inputs: tuple) -> list[tuple]:
    import torch

    samples = []
    for line in _read_input_list(path):
        samples.append(tuple(torch.from_numpy(_read_npy(p).copy()) for p in line))
    return samples


@click.command("quantize")
@click.argument("factory")
@click.option("--scheme", type=click.Choice(_SCHEMES), default="8a8w", show_default=True,
              help="Activation/weight bits (docs/quantization.md).")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False), metavar="LIST",
              help="Calibration samples: one per line, its input .npy paths separated by spaces.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Program file to write.")
@click.option("--per-tensor", is_flag=True, help="Per-tensor weights (default: per channel).")
@click.option("--symmetric", is_flag=True, help="Symmetric activations (zero point 0).")
@click.option("--observer", type=click.Choice(["minmax", "moving_average", "histogram"]),
              default="minmax", show_default=True, help="Activation observer.")
@click.option("--discard-op", "discard_ops", multiple=True, metavar="OP",
              help="Leave this op in floating point (e.g. aten::softmax). Repeatable.")
@click.option("--kernels", "kernels", multiple=True, metavar="SET",
              help="Kernel set(s) to check the program against, as `opforge export --kernels`.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def quantize(factory: str, scheme: str, calibration: str | None, output: str, per_tensor: bool,
             symmetric: bool, observer: str, discard_ops: tuple[str, ...],
             kernels: tuple[str, ...], as_json: bool) -> None:
    """Quantize FACTORY (MODULE:FUNCTION returning (model, example_inputs)) and write a program."""
    import logging
    import warnings

    # torchao logs a warning per CUDA extension it cannot load on a CPU-only machine
    logging.getLogger("torchao").setLevel(logging.ERROR)

    from opforge.cli.tables import table_console
    from opforge.program import save
    from opforge.quantize import Quantizer, QuantizeError
    from opforge.quantize import quantize as quantize_model

    console = table_console()
    ((method, (model, inputs)),) = methods_from_factory(factory, load_factory(factory)(), ()).items()
    inputs = tuple(inputs)
    samples = _calibration(calibration, inputs) if calibration else None
    quantizer = Quantizer(scheme, per_channel_conv=not per_tensor,
                          per_channel_linear=not per_tensor, act_symmetric=symmetric,
                          act_observer=observer)
    if discard_ops:
        quantizer.add_discard_ops(discard_ops)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            result = quantize_model(model, inputs, quantizer=quantizer, calibration=samples)
        except QuantizeError as exc:
            raise click.ClickException(str(exc)) from None
    for warning in caught:
        if "calibration" in str(warning.message):
            click.echo(f"warning: {warning.message}", err=True)
    program = result.export(kernels=list(kernels) or None)
    save(program, output)
    if as_json:
        data = result.report.to_dict()
        data["output"] = output
        click.echo(json.dumps(data, indent=2))
        return
    result.report.print_table(console)
    size = sum(s.nbytes for s in program.segments)
    console.print(f"wrote {output} ({scheme}, constants {size:,} bytes)")
