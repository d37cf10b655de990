"""`progrouter epp`: an Envoy ext_proc Endpoint Picker around the Program scheduler (docs/epp.md)."""
