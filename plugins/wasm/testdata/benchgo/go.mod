module wickettest/benchgo

go 1.24

require github.com/wicket-run/wicket/policy-sdk/go v0.0.0

replace github.com/wicket-run/wicket/policy-sdk/go => ../../../../policy-sdk/go
