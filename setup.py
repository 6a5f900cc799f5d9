"""Packaging hook: the model card templates live in the top-level `model_cards/` folder and ship
inside the package as `hf_mocose/templates/` (everything else is in setup.cfg)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithCardTemplates(build_py):
    """Copies model_cards/*.md.j2 into the built package (hf_mocose/templates/)."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "hf_mocose" / "templates"
        target.mkdir(parents=True, exist_ok=True)
        for template in sorted((Path(__file__).resolve().parent / "model_cards").glob("*.md.j2")):
            shutil.copy2(template, target / template.name)


setup(cmdclass={"build_py": BuildPyWithCardTemplates})
