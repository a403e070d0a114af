package kernel

// PurgeStats counts what retention deleted.
type PurgeStats struct {
	Executions, Events, Steps, Approvals, Counters int
}

// Add adds o to p.
func (p *PurgeStats) Add(o PurgeStats) {
	p.Executions += o.Executions
	p.Events += o.Events
	p.Steps += o.Steps
	p.Approvals += o.Approvals
	p.Counters += o.Counters
}
