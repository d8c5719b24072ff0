"""Config-driven evaluation: resolve the model, build the backend once, evaluate every dataset,
print summary lines and write the JSON report."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rl_core.config import config_to_dict
from rl_eval.config import EvalConfig
from rl_eval.errors import EvalError
from rl_eval.models import hf_model_dir, load_tokenizer
from rl_eval.runner import EvalReport, evaluate


def run_eval(cfg: EvalConfig, *, print_fn=print) -> list[EvalReport]:
    """Evaluate ``cfg.model`` on each of ``cfg.datasets``; returns one report per dataset."""
    from rl_backends_gen import build_generation_backend, check_generation
    from rl_core.cluster import init_ray
    from rl_core.config import ConfigError
    from rl_environments.registry import build_environment

    if cfg.report_path:
        check_report_path(cfg.report_path)  # before the evaluation, not after it
    datasets = [(d, d.name or d.data.default_name(), d.data.build(f"datasets.{i}.data"))
                for i, d in enumerate(cfg.datasets)]
    model_name = cfg.model_name or Path(cfg.model.rstrip("/")).name
    reports = []
    with hf_model_dir(cfg.model) as model_dir:
        tokenizer = load_tokenizer(model_dir)
        try:
            check_generation(cfg.generation, model_dir)
            if cfg.generation.num_replicas > 0:
                init_ray(cfg.cluster)
            backend = build_generation_backend(cfg.generation, model_dir)
        except ConfigError as e:
            raise EvalError(str(e)) from None
        try:
            for dcfg, name, samples in datasets:
                grader_cfg = dcfg.grader_config()
                try:
                    grader = build_environment(grader_cfg.name, **grader_cfg.kwargs)
                except (KeyError, TypeError, ValueError) as e:
                    raise EvalError(f"dataset {name}: grader {grader_cfg.name!r}: {e}") from None
                report = evaluate(backend, tokenizer, samples, grader, cfg.sampling.params(), cfg.k_values,
                                  model_name=model_name, dataset_name=name, answer_format=grader_cfg.voting_format(),
                                  greedy=cfg.greedy, batch_size=cfg.batch_size, prompt_template=dcfg.prompt_template,
                                  progress=cfg.progress)
                if hasattr(grader, "close"):
                    grader.close()
                for line in report.summary_lines():
                    print_fn(line)
                reports.append(report)
        finally:
            backend.shutdown()
    if cfg.report_path:
        write_report(cfg.report_path, cfg, reports)
    return reports


def write_report(path: str | os.PathLike, cfg: EvalConfig | None, reports: list[EvalReport]) -> None:
    """The JSON report (config, summary lines, metrics and per-item results), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": config_to_dict(cfg) if cfg is not None else None,
        "summary": [line for r in reports for line in r.summary_lines()],
        "results": [r.to_dict() for r in reports],
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_report_path(path: str | os.PathLike) -> None:
    """EvalError (key ``report_path``) when the report could not be written at ``path``: a directory there, a
    file where a parent directory must be, or a nearest existing directory that is not writable."""
    path = Path(path).absolute()
    if path.is_dir():
        raise EvalError(f"report_path: {path} is a directory; give a file path such as {path / 'report.json'}")
    existing = next(p for p in path.parents if p.exists())
    if not existing.is_dir():
        raise EvalError(f"report_path: {existing} is a file, so {path} cannot be written; choose another report_path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EvalError(f"report_path: {existing} is not writable; choose another report_path")
