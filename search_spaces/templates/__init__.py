"""The built-in templates: one module per template family (registered in ``search_spaces``)."""
