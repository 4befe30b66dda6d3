"""broker subpackage."""
