"""The recipe: YAML files read safely (``yaml_files``), loaded and validated (``load``), a recipes
folder checked against the project (``checks``) and expanded into stage specs (``plan``)."""
