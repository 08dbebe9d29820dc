"""An example user package: a model factory trainflow calls as ``factory(spec, **params)``."""
