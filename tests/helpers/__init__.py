"""What the tests share -- launchers, models, data, runs -- one module per subject. A test module imports from
here, never from another test module (an import-linter contract, setup.cfg), so that each test file reads alone."""
