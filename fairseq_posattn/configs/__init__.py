"""The ``fairseq-hydra-train`` configs shipped with the package: one YAML file per model of the
quickstart and of each recipe in ``examples/`` (docs/hydra_configs.md), in ``configs/<family>/``.

    fairseq-hydra-train --config-dir "$(python -m fairseq_posattn.configs)/quickstart" \\
        --config-name structural task.data=DATA_BIN \\
        common.user_dir="$(python -m fairseq_posattn.configs --user-dir)"

Each file holds the model (with its position options), task, criterion, optimizer, learning-rate
schedule and batch settings of its recipe; ``task.data`` and ``common.user_dir`` are left mandatory
(``???``) for the command line, and any other value can be overridden there (``model.dropout=0.3``).

fairseq merges a section into its registered dataclass, which refuses unknown keys, only for the
components that have one; the models registered the argparse way (``transformer_posattn``,
``san_tagger``, the LSTM language models, the classifier) accept any key silently. :func:`check_config`
(``python -m fairseq_posattn.configs --check FILE``) checks every section of a config, those models
included, against the options fairseq-train would accept for them.
"""

import argparse
import dataclasses
import difflib
import os
from typing import Any, Dict, Iterable, List, Optional, Set

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


class ConfigCheckError(ValueError):
    """A config that fairseq-hydra-train would refuse, or would silently misread."""


def config_dir() -> str:
    """The directory of the shipped configs (``--config-dir`` is one of its family subdirectories)."""
    return CONFIG_DIR


def plugin_dir() -> str:
    """The plugin's directory: the value of ``common.user_dir`` (``--user-dir``)."""
    return os.path.dirname(CONFIG_DIR)


def shipped_configs() -> List[str]:
    """Paths of every shipped config, sorted by family and name."""
    paths = []
    for family in sorted(os.listdir(CONFIG_DIR)):
        folder = os.path.join(CONFIG_DIR, family)
        if os.path.isdir(folder):
            paths.extend(os.path.join(folder, name) for name in sorted(os.listdir(folder))
                         if name.endswith(".yaml"))
    return paths


def describe(path: str) -> str:
    """A config's first comment line: which paper's model in which recipe."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    return first.lstrip("#").strip()


def check_config(path: str) -> None:
    """Raise :class:`ConfigCheckError` listing every problem of the config at ``path``: a YAML error,
    an unknown section, a ``_name`` that no fairseq registry knows (after importing this plugin),
    a key the component does not take (with the nearest valid names), or a value of the wrong
    type or outside a choice."""
    try:
        cfg = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException, ValueError) as e:
        raise ConfigCheckError(f"{path}: not a readable YAML config: {e}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigCheckError(f"{path}: a config is a mapping of sections, got {type(cfg).__name__}")
    problems = section_problems(cfg)
    if problems:
        raise ConfigCheckError(f"{path}:\n  " + "\n  ".join(problems))


def section_problems(cfg: DictConfig) -> List[str]:
    """Problems of every section of ``cfg`` (``hydra`` is Hydra's own and not checked)."""
    from fairseq.dataclass.configs import FairseqConfig

    problems = []
    task = cfg.get("task")
    fields = FairseqConfig.__dataclass_fields__
    for section in cfg:
        if section == "hydra":
            continue
        if section not in fields or section == "_name":
            problems.append(f"unknown section '{section}'{suggest(section, fields)}")
        elif dataclasses.is_dataclass(fields[section].type):
            problems.extend(dataclass_problems(section, fields[section].type, cfg[section]))
        else:  # task, model, criterion, optimizer, lr_scheduler, ...: a registered component by _name
            problems.extend(named_section_problems(section, cfg[section], task))
    for section in ("task", "model"):
        if section not in cfg:
            problems.append(f"no '{section}' section: fairseq-hydra-train needs {section}._name")
    return problems


def named_section_problems(section: str, node: Any, task: Any) -> List[str]:
    """A task / model / criterion / optimizer / lr_scheduler section against its registered component."""
    if isinstance(node, str):  # fairseq's short form, e.g. ``criterion: cross_entropy``
        node = OmegaConf.create({"_name": node})
    name = node.get("_name") if isinstance(node, DictConfig) else None
    known = registered_names(section)
    if name is None:
        return [f"{section}: no _name (one of the registered {section}s, e.g. {sorted(known)[:3]})"]
    if name not in known:
        return [f"{section}._name '{name}' is not registered{suggest(name, known)}"]
    dataclass = component_dataclass(section, name)
    if dataclass is not None:
        return dataclass_problems(section, dataclass, node)
    return legacy_problems(section, name, node, task)


def registered_names(section: str) -> Set[str]:
    """Every name fairseq accepts as ``{section}._name`` (this plugin is registered on import)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    if section == "model":
        return set(ARCH_MODEL_REGISTRY) | set(MODEL_DATACLASS_REGISTRY)
    if section == "task":
        return set(TASK_REGISTRY)
    return set(REGISTRIES[section]["registry"])


def component_dataclass(section: str, name: str) -> Optional[type]:
    """The dataclass fairseq merges the section into, or None for an argparse-registered component."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    if section == "model":
        return MODEL_DATACLASS_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(name, name))
    if section == "task":
        return TASK_DATACLASS_REGISTRY.get(name)
    return REGISTRIES[section]["dataclass_registry"].get(name)


def dataclass_problems(section: str, dataclass: type, node: Any) -> List[str]:
    """Unknown keys, then wrong types or choices, by merging into the dataclass as fairseq does."""
    if not isinstance(node, DictConfig):
        return [f"{section}: a mapping of options, got {node!r}"]
    fields = {f.name for f in dataclasses.fields(dataclass)}
    unknown = [key for key in node if key != "_name" and key not in fields]
    if unknown:
        return [unknown_key(section, key, fields) for key in unknown]
    values = OmegaConf.masked_copy(node, [key for key in node if key != "_name"])
    try:
        OmegaConf.merge(OmegaConf.structured(dataclass), values)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        return [f"{section}.{key}: {str(e).splitlines()[0]}"]
    return []


def legacy_problems(section: str, name: str, node: DictConfig, task: Any) -> List[str]:
    """An argparse-registered model or criterion: its keys against the options fairseq-train would
    give it (its own, the ones its architecture function sets, and, for a model, the task's, which
    share the model's namespace there), and each value against the option's choices and type."""
    actions = legacy_actions(section, name)
    accepted = set(actions) | legacy_arch_keys(section, name) | task_fields(task)
    if section == "model":
        accepted.add("criterion")  # fairseq's lstm_lm reads args.criterion: in a config, model.criterion
    problems = []
    for key in node:
        if key == "_name":
            continue
        if key not in accepted:
            problems.append(unknown_key(section, key, accepted))
        elif key in actions:
            problem = value_problem(actions[key], node[key])
            if problem:
                problems.append(f"{section}.{key}: {problem}")
    return problems


def legacy_actions(section: str, name: str) -> Dict[str, argparse.Action]:
    """The argparse options of an argparse-registered component, by destination."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.registry import REGISTRIES

    cls = ARCH_MODEL_REGISTRY[name] if section == "model" else REGISTRIES[section]["registry"][name]
    parser = argparse.ArgumentParser(add_help=False)
    if hasattr(cls, "add_args"):
        cls.add_args(parser)
    return {action.dest: action for action in parser._actions}


def legacy_arch_keys(section: str, name: str) -> Set[str]:
    """Options an architecture function sets (and so reads) on an empty namespace."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    if section != "model" or name not in ARCH_CONFIG_REGISTRY:
        return set()
    namespace = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[name](namespace)
    return set(vars(namespace))


def task_fields(task: Any) -> Set[str]:
    """The fields of the config's task (fairseq-train hands an argparse model the task's options too)."""
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    name = task if isinstance(task, str) else (task.get("_name") if isinstance(task, DictConfig) else None)
    dataclass = TASK_DATACLASS_REGISTRY.get(name)
    return {f.name for f in dataclasses.fields(dataclass)} if dataclass else set()


def value_problem(action: argparse.Action, value: Any) -> Optional[str]:
    """Why ``value`` is not what the argparse option takes, or None."""
    if value is None:
        return None
    if action.choices is not None and value not in action.choices:
        return f"{value!r} is not one of {sorted(map(str, action.choices))}"
    if action.nargs == 0 and not isinstance(value, bool):  # store_true / store_false flags
        return f"a flag takes true or false, got {value!r}"
    if action.type in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"takes a number, got {value!r}"
    if action.type is int and isinstance(value, float):
        return f"takes an integer, got {value!r}"
    return None


def unknown_key(section: str, key: str, valid: Iterable[str]) -> str:
    return f"{section}.{key} is not an option of this {section}{suggest(key, valid)}"


def suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""
