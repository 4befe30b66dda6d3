"""allocation subpackage."""
