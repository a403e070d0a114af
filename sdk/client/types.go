package client

import "github.com/wicket-run/wicket/server/wire"

// Aliases of the wire types the methods take and return, so that most
// callers need not import server/wire. They are the same types.
type (
	// Execution is an execution as the API shows it.
	Execution = wire.Execution
	// ExecutionList is one page of ListExecutions.
	ExecutionList = wire.ExecutionList
	// CreateExecutionRequest is the body of CreateExecution.
	CreateExecutionRequest = wire.CreateExecutionRequest
	// Limits bound an execution.
	Limits = wire.Limits
	// Event is one row of an execution's event log.
	Event = wire.Event
	// StepDelta is one live piece of a step's output, as Watch delivers it.
	StepDelta = wire.StepDeltaEvent
	// Step is a step as the API shows it.
	Step = wire.Step
	// Approval is an approval as the API shows it.
	Approval = wire.Approval
	// ResolveApprovalRequest is the body of Grant and Deny.
	ResolveApprovalRequest = wire.ResolveApprovalRequest
	// Agent is a registered agent (never with its secret).
	Agent = wire.Agent
	// AgentRequest is the body of PutAgent.
	AgentRequest = wire.AgentRequest
	// Bundle is a stored policy bundle's metadata.
	Bundle = wire.Bundle
	// BundleFilesRequest is the body of PutBundleFiles.
	BundleFilesRequest = wire.BundleFilesRequest
	// PolicyResponse is the answer of SetPolicy.
	PolicyResponse = wire.PolicyResponse
	// PolicyEvalRequest is the body of EvalPolicy.
	PolicyEvalRequest = wire.PolicyEvalRequest
	// PolicyEvalResponse is the answer of EvalPolicy.
	PolicyEvalResponse = wire.PolicyEvalResponse
	// Tenant is a tenant as the API shows it.
	Tenant = wire.Tenant
	// TenantRequest is the body of CreateTenant.
	TenantRequest = wire.TenantRequest
	// KeyRequest is the body of CreateKey.
	KeyRequest = wire.KeyRequest
	// CreatedKey is the answer of CreateKey: the only time the key's secret
	// is shown.
	CreatedKey = wire.CreatedKey
	// Key is an API key as listed (never its secret).
	Key = wire.Key
	// SessionRequest is the body of BeginSession.
	SessionRequest = wire.SessionRequest
	// Session is an execution and the lease its holder holds (BeginSession,
	// AttachSession).
	Session = wire.Session
)

// Types of the events that end an execution's log. Nothing is appended
// after one of them.
const (
	EventExecutionCompleted = "execution.completed"
	EventExecutionFailed    = "execution.failed"
	EventExecutionCancelled = "execution.cancelled"
	// EventStepDelta is the SSE event type of live step output (never stored).
	EventStepDelta = "step.delta"
)

// IsTerminalEvent reports whether an event of type typ ends its execution's
// log (execution.completed, execution.failed or execution.cancelled).
func IsTerminalEvent(typ string) bool {
	return typ == EventExecutionCompleted || typ == EventExecutionFailed || typ == EventExecutionCancelled
}

// IsTerminalStatus reports whether an execution status is final
// (completed, failed or cancelled).
func IsTerminalStatus(status string) bool {
	return status == "completed" || status == "failed" || status == "cancelled"
}
