"""Learned feedback models: the reward model (Bradley-Terry), the judge model and
the preference pairs they train on."""
