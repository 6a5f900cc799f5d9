"""Recipes and launcher configs by name (`hf-mocose recipes`), from a checkout or an installed wheel.

A recipe is named (`quickstart`: a YAML file of `training_args/`) or a path to any YAML; a launcher config likewise
(`fsdp2`: `configs/accelerate/`). The checkout's folders are read first (an editable install); a wheel carries copies
(`hf_mocose/recipes/`, `hf_mocose/accelerate_configs/`, setup.py). A recipe's first line, a comment, says its purpose.
`hf-mocose recipes --slurm` prints the SLURM job script (`hf_mocose/launch/mocose.sbatch`, docs/distributed.md).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]
RECIPES, ACCELERATE_CONFIGS = ("training_args", "recipes"), ("configs/accelerate", "accelerate_configs")
SLURM_SCRIPT = resources.files("hf_mocose") / "launch" / "mocose.sbatch"


def named_files(kind: tuple[str, str]) -> dict[str, Path]:
    """`{name: path}` of the YAML files of `RECIPES` or `ACCELERATE_CONFIGS` (the checkout's, else the package's)."""
    folder = _CHECKOUT / kind[0]
    folder = folder if folder.is_dir() else Path(str(resources.files("hf_mocose") / kind[1]))
    return {path.stem: path for path in sorted(folder.glob("*.yaml"))}


def resolve_yaml(value: str, kind: tuple[str, str] = RECIPES, what: str = "Recipe") -> Path:
    """`value` if it is a file, else the packaged file of that name (`quickstart` or `quickstart.yaml`)."""
    known = named_files(kind)
    if Path(value).is_file():
        return Path(value)
    if Path(value).name == value and value.removesuffix(".yaml") in known:
        return known[value.removesuffix(".yaml")]
    raise FileNotFoundError(f"{what} {value!r} does not exist: give a YAML file or the name of one that ships with "
                            f"hf-mocose ({', '.join(known) or 'none found'}).")


def recipe_purpose(path: Path) -> str:
    """What a recipe is for: its first line, a comment."""
    first = (path.read_text(encoding="utf-8").splitlines() or [""])[0]
    return first.lstrip("#").strip() if first.startswith("#") else ""


def print_recipes() -> None:
    recipes = named_files(RECIPES)
    width = max(map(len, recipes), default=0)
    print("Recipes (hf-mocose train RECIPE, or a path to your own YAML):")
    print("\n".join(f"  {name:<{width}}  {recipe_purpose(path)}" for name, path in recipes.items()))
    print(f"Launcher configs (--accelerate_config NAME, or a path): {', '.join(named_files(ACCELERATE_CONFIGS))}")


def register(subparsers) -> None:
    parser = subparsers.add_parser("recipes", help="the recipes and launcher configs that ship with hf-mocose")
    parser.add_argument("--slurm", action="store_true", help="print the SLURM job script (docs/distributed.md)")
    parser.set_defaults(func=lambda args: print(SLURM_SCRIPT.read_text(encoding="utf-8"), end="") if args.slurm
                        else print_recipes())
