package console

// SetPages sets the console's page sizes for a test and returns what puts
// them back.
func SetPages(approvalsPage, pendingMost, stepsPage int) (restore func()) {
	a, p, s := approvalsPageSize, maxPendingListed, stepsPageSize
	approvalsPageSize, maxPendingListed, stepsPageSize = approvalsPage, pendingMost, stepsPage
	return func() { approvalsPageSize, maxPendingListed, stepsPageSize = a, p, s }
}
