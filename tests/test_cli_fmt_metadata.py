"""`xlapy fmt --no-metadata` drops the metadata={...} attributes and keeps the rest."""

WITH_METADATA = """HloModule m

ENTRY main {
  a = f32[4] parameter(0)
  ROOT n = f32[4] negate(a), metadata={op_name="jit(f)/neg" source_file="f.py" source_line=3}
}
"""


def test_fmt_no_metadata_drops_metadata(run_cli, write):
    code, kept, _ = run_cli("fmt", write("m.hlo", WITH_METADATA))
    assert code == 0
    assert 'op_name="jit(f)/neg"' in kept
    code, dropped, err = run_cli("fmt", "--no-metadata", write("m2.hlo", WITH_METADATA))
    assert code == 0, err
    assert "metadata" not in dropped
    assert "n = f32[4] negate(a)" in dropped
