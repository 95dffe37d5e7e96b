"""The grader: suites, the hidden test-set store, evaluations, submissions and scores."""
