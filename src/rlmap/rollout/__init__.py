"""Episodes against environments packed into the batch record, their rewards
(scoring) and the held-out evaluation."""
