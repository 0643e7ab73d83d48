"""Building a run's live objects from its config: models, data, environments,
verifiers, engines, learner; and the checks that refuse a config this machine cannot run."""
