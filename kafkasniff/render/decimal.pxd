"""An integer's decimal digits, written in C where the views write many numbers (str() of an int costs several
times as much): values.pyx's field values, bytemap.pyx's offsets."""

cdef enum:
    DECIMAL_ROOM = 24  # bytes a buffer needs: "-9223372036854775808" is 20


cdef inline int write_decimal(char *text, long long n) noexcept nogil:
    """Writes n's digits, and its sign, to end at text[DECIMAL_ROOM]; returns where they start."""
    cdef unsigned long long u = <unsigned long long>(-(n + 1)) + 1 if n < 0 else <unsigned long long>n
    cdef int at = DECIMAL_ROOM
    while True:
        at -= 1
        text[at] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    if n < 0:
        at -= 1
        text[at] = b'-'
    return at
