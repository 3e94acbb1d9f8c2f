-- One database per store, both owned by the paretolab role the compose file creates.
CREATE DATABASE optuna OWNER paretolab;
CREATE DATABASE mlflow OWNER paretolab;
