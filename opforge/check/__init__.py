"""``opforge check``: an opcheck for compiled kernels that can fail for real.

    from opforge.check import check_op
    report = check_op(opdef, kernel)          # one op; see opcheck.check_op
    report.ok, report.verified, report.to_json()

The stages, one module each: ``samples`` (argument values per argument kind, and the
manifest's ``samples:``), ``isolation`` (each kernel run in a child process, with guard
zones around its outputs), ``compare`` (whole mismatch texts), ``opcheck`` (the order:
fake → reference → kernel → compare). ``opforge/cli/check_cmd.py`` is the command.
"""

from opforge.check.compare import compare
from opforge.check.isolation import Job, KernelRun, run_isolated
from opforge.check.opcheck import NO_REFERENCE, OpReport, check_op
from opforge.check.samples import Sample, generate_samples

__all__ = ["NO_REFERENCE", "Job", "KernelRun", "OpReport", "Sample", "check_op", "compare",
           "generate_samples", "run_isolated"]
