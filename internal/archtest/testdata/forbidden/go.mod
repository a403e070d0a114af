module github.com/wicket-run/wicket

go 1.26

require github.com/open-policy-agent/opa v1.0.0

replace github.com/open-policy-agent/opa => ./opa
