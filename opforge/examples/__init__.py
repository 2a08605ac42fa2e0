"""Example models and operator manifests that ship with opforge."""
