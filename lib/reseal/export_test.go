package reseal

// SealedColumns lists the columns Run re-seals, as table.column.
func SealedColumns() []string {
	out := make([]string, len(columns))
	for i, c := range columns {
		out[i] = c.table + "." + c.name
	}
	return out
}

// BeforeWrite sets a hook run between each batch's read and its write.
func (r *Resealer) BeforeWrite(f func(column string)) { r.beforeWrite = f }

// SetBatch sets how many rows one statement re-seals.
func (r *Resealer) SetBatch(n int) { r.batch = n }
