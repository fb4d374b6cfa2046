"""Every config composes and validates; bad input fails at start-up with one line naming the field and value."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from arch_space.errors import ConfigError
from codesign.cli import CONF_DIR, overridden_keys, precheck
from codesign.main import _validate
from codesign.schema import load_study

GROUPS = sorted(d.name for d in CONF_DIR.iterdir() if d.is_dir())
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


def composed(overrides=()):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def test_groups_cover_every_axis():
    for g in ("hardware", "generation", "workload", "scenario", "space", "sweep", "report", "experiment",
              "precision"):
        assert g in GROUPS


def test_default_config_validates():
    study = load_study(composed())
    assert study.hardware.name == "jalapeno_gen1"
    assert set(study.generations) == {"gen2", "gen3"}
    assert [c.name for c in study.competitors][:2] == ["gb200", "gb300"]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_config_option_composes_and_validates(group, option):
    override = f"{group}=[{option}]" if group == "generation" else f"{group}={option}"
    extra = ["workload=deepseek_r1"] if (group, option) == ("scenario", "inferencex_8k1k_mtp") else []
    if (group, option) == ("workload", "llama2_70b"):
        extra = ["scenario=inferencex_1k1k"]  # 4096 positions: the default 8k/1k does not fit (refused below)
    study = load_study(composed([override, *extra]), overridden=overridden_keys([override, *extra]))
    if group == "hardware":
        assert study.hardware.name == option
    if group == "workload":
        assert study.workload.name == option
        assert [a.name for a in study.workloads] == [option]  # picking a workload studies it alone


def test_default_study_is_the_inferencex_mix():
    study = load_study(composed())
    assert study.mix_weights == {"gpt_oss_120b": 1.0, "deepseek_r1": 1.0, "kimi_k2_5": 1.0}
    assert study.workloads[0].name == study.workload.name == "gpt_oss_120b"
    # an explicit mix on the command line wins over the single-workload rule
    over = ["workload=deepseek_r1", "mix=[llama3_8b,deepseek_r1]", "mix_weights=[1,2]"]
    study = load_study(composed(over), overridden=overridden_keys(over))
    assert study.mix_weights == {"deepseek_r1": 2.0, "llama3_8b": 1.0}
    assert study.workloads[0].name == "deepseek_r1"  # the primary workload first


@pytest.mark.parametrize("over,expect", [
    (["mix=[gpt_oss_120b,nope]"], "mix[1]: unknown workload preset 'nope'"),
    (["mix=[gpt_oss_120b]", "mix_weights=[-1]"], "mix_weights[0]: must be > 0, got -1"),
    (["mix=[gpt_oss_120b]", "mix_weights=[1,2]"], "mix_weights: expected one weight per mix entry (1)"),
    (["mix=[llama3_8b]"], "mix: does not include the workload 'gpt_oss_120b'"),
    (["mix=[gpt_oss_120b,gpt_oss_120b]"], "mix: lists a workload twice"),
])
def test_bad_mix_is_one_clear_error(over, expect):
    with pytest.raises(ConfigError) as ei:
        load_study(composed(over), overridden=overridden_keys(over))
    assert str(ei.value).startswith(expect) and "\n" not in str(ei.value)


def check(argv):
    with pytest.raises(ConfigError) as ei:
        precheck(argv, _validate)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("argv,expect", [
    (["hardware=no_such_chip"], "hardware: unknown preset 'no_such_chip'"),
    (["workload=gpt5"], "workload: unknown preset 'gpt5'"),
    (["workload=llama2_70b"], "scenario: the scenario 'inferencex_8k1k' reaches 9216 tokens of context, llama2_70b "
                              "attends over at most 4096 positions"),
    (["hardware=null"], "hardware: expected a preset name (known: "),  # was Hydra's 'Got NoneType'
    (["-m", "workload=llama3_8b,nope"], "workload: unknown preset 'nope'"),
    (["hardware.hbm_bandwidth_bytes_per_s=-1"], "hardware.hbm_bandwidth_bytes_per_s: must be > 0, got -1"),
    (["hardware.hbm_bandwidth_bytes_per_s=0"], "hardware.hbm_bandwidth_bytes_per_s: must be > 0, got 0"),
    (["hardware.hbm_bandwidth_bytes_per_s=nan"], "hardware.hbm_bandwidth_bytes_per_s: must be finite, got nan"),
    (["hardware.power_rating_w=inf"], "hardware.power_rating_w: must be finite, got inf"),
    (["hardware.hbm_bandwidth_bytes_per_s=fast"], "hardware.hbm_bandwidth_bytes_per_s: expected a number, got 'fast'"),
    (["+hardware.warp_drive=1"], "hardware.warp_drive: unknown hardware field"),
    (["hardware.warp_drive=1"], "Could not override 'hardware.warp_drive'"),
    (["scenario.isl_tokens=-5"], "scenario.isl_tokens: must be > 0, got -5"),
    (["scenario.kind=open_loop"], "scenario.kind: must be one of closed_loop, offline, disaggregated, agentic, got"),
    (["scenario.acceptance_rate=1.2"], "scenario.acceptance_rate: must be < 1, got 1.2"),
    (["sweep.mappings=[tp1,tp3]"], "sweep.mappings[1]: unknown mapping 'tp3'"),
    (["sweep.mappings=[]"], "sweep.mappings: needs at least one mapping name"),
    ([f"sweep.output_dir={__file__}"], f"sweep.output_dir: '{__file__}' is an existing file, not a directory"),
    (["sweep.num_workers=two"], "sweep.num_workers: expected a number, got 'two'"),
    (["sweep.batch_size=0"], "sweep.batch_size: must be > 0, got 0"),
    (["competitors=[b200,h900]"], "competitors[1]: unknown hardware preset 'h900'"),
    (["space.hbm_stacks=[8,-2]"], "space.hbm_stacks[1]: must be > 0, got -2"),
    (["report.objective=vibes"], "report.objective: must be one of"),
    (["report.dpi=100000"], "report.dpi: must be <= 1200 (print quality is 300), got 100000"),
    (["serving.gemm_efficiency_max=1.5"], "serving.gemm_efficiency_max: must be <= 1"),
    (["serving.hbm_reserve_fraction=1.0"], "serving.hbm_reserve_fraction: must be < 1, got 1.0"),
    (["workload.num_layers=-3"], "workload.num_layers"),
    (["generation.gen2.hbm_stack_bandwidth_bytes_per_s=-1"],
     "generation.gen2.hbm_stack_bandwidth_bytes_per_s: must be > 0, got -1"),
    (["precision.kv_cache=fp2"], "precision.kv_cache: must be one of"),
    (["scenario=inferencex_8k1k_mtp", "workload=llama3_70b"], "scenario.draft_tokens: 3 MTP draft tokens, but"),
])
def test_bad_input_is_one_clear_line(argv, expect):
    assert expect in check(argv)


def test_command_line_override_is_marked_in_provenance():
    study = load_study(composed(["hardware.hbm_bandwidth_bytes_per_s=2e13"]),
                       overridden=("hardware.hbm_bandwidth_bytes_per_s",))
    assert study.hardware.hbm_bandwidth_bytes_per_s == 2e13
    assert study.hardware.provenance_of("hbm_bandwidth_bytes_per_s").source.startswith("set on the command line")


@pytest.mark.parametrize("argv,expect", [
    (["hardware=no_such_chip"], "codesign: error: hardware: unknown preset 'no_such_chip'"),
    (["hardware.hbm_bandwidth_bytes_per_s=-1"], "codesign: error: hardware.hbm_bandwidth_bytes_per_s: must be > 0"),
])
def test_cli_prints_one_line_and_exits_nonzero(argv, expect, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "codesign.main", *argv, f"hydra.run.dir={tmp_path}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith(expect), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "results.parquet").exists()


def test_yaml_comments_reads_each_key_and_its_continuation_lines(tmp_path):
    from codesign.schema import yaml_comments

    f = tmp_path / "x.yaml"
    f.write_text("# header, no key\n"
                 "a: 1.0   # first reason\n"
                 "         # continued over a small-\n"
                 "         # message line\n"
                 "b: 2\n"
                 "         # a comment under a key without one is not its reason\n"
                 "c: [1, 2]  # list value\n"
                 "d:\n"
                 "  nested: 3  # nested keys are not top-level parameters\n"
                 "\n"
                 "# a free comment\n"
                 "e: 4  # e's\n")
    assert yaml_comments(f) == {"a": "first reason continued over a small-message line", "c": "list value",
                                "e": "e's"}


def test_every_serving_parameter_states_its_reason_in_the_starting_config():
    """The brief: every number in a config has a source or is marked as an assumption with its reasoning. The
    starting config's comments are also the report's source for the parameters a fit keeps (report_tables)."""
    import dataclasses

    from codesign.schema import yaml_comments
    from codesign.study import SERVING_DEFAULTS
    from serving.perf import ServingParams

    reasons = yaml_comments(SERVING_DEFAULTS)
    for f in dataclasses.fields(ServingParams):
        assert len(reasons.get(f.name, "")) > 20, f"{f.name}: no reason in {SERVING_DEFAULTS}"
