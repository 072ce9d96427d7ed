"""Training on transformers.Trainer: the trainers (fine-tuning, pretraining), cfg.train as
TrainingArguments and its ranges, optimizer groups, class weights, early stopping, exact resume,
token-budget batches, train.compile's shapes, SetFit's contrastive stage."""
