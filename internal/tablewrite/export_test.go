package tablewrite

// Encodes reports whether w sends reading items encoded (tests).
func Encodes(w *Writer) bool { return w.encodes }
