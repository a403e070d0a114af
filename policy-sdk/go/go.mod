module github.com/wicket-run/wicket/policy-sdk/go

go 1.24
