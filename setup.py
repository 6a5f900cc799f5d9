"""Packaging hook: files kept in top-level folders of the checkout ship inside the package (everything else is in
setup.cfg): the model card templates (`model_cards/` -> `hf_mocose/templates/`), the recipes (`training_args/` ->
`hf_mocose/recipes/`) and the launcher configs (`configs/accelerate/` -> `hf_mocose/accelerate_configs/`), so that an
installed package trains by recipe name from any folder (`hf_mocose.commands.recipes` reads the checkout's first)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# checkout folder, file pattern -> package sub-folder
PACKAGE_DATA_FOLDERS = {("model_cards", "*.md.j2"): "templates", ("training_args", "*.yaml"): "recipes",
                        ("configs/accelerate", "*.yaml"): "accelerate_configs"}


class BuildPyWithPackageData(build_py):
    """Copies `PACKAGE_DATA_FOLDERS` into the built package."""

    def run(self):
        super().run()
        for (source, pattern), packaged in PACKAGE_DATA_FOLDERS.items():
            target = Path(self.build_lib) / "hf_mocose" / packaged
            target.mkdir(parents=True, exist_ok=True)
            for path in sorted((Path(__file__).resolve().parent / source).glob(pattern)):
                shutil.copy2(path, target / path.name)


setup(cmdclass={"build_py": BuildPyWithPackageData})
