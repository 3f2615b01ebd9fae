package webhooks

// SQLDispatch is Dispatch's statement, for a test to hold it in a
// transaction of its own.
const SQLDispatch = sqlDispatch
