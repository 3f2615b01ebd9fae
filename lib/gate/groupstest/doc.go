// Package groupstest holds the HTTP-level tests of effect groups and
// reconciliation. They live in their own package, so in their own database:
// their sweeps act on every workspace of that database, and must neither
// disturb the gate package's tests nor be disturbed by them.
package groupstest
