module github.com/wicket-run/wicket

go 1.26
