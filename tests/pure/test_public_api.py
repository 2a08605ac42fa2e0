"""The documented public surface is what is exported, and `import opforge` stays lean."""

import opforge
import opforge.manifest
import opforge.schema



def test_top_level_surface():
    for name in opforge.__all__:
        assert getattr(opforge, name) is not None, name
    assert issubclass(opforge.SchemaError, opforge.OpforgeError)
    assert opforge.op is opforge.manifest.op


def test_subpackage_surfaces():
    for module in (opforge.schema, opforge.manifest):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_define_stage_imports_without_torch(python_without_torch):
    code = """
        import opforge, opforge.schema, opforge.manifest
        d = opforge.manifest.parse_manifest(
            "- func: my_ops::mul3(Tensor input) -> Tensor\\n"
            "  kernels:\\n    - arg_meta: null\\n      kernel_name: custom::mul3_out_impl\\n")
        assert d[0].kernels[0].cpp_name == "custom::native::mul3_out_impl"
        assert "torch" not in sys.modules
        print("ok")
    """
    proc = python_without_torch(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
