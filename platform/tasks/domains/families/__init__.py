"""Domain families; each module's ``domains()`` returns its registered domains."""
