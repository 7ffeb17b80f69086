package io.github.fencedlock;

/** Rethrows what {@code fn} threw, checked or not, as it was: {@link FencedLock#run} declares it. */
final class Sneaky {
  private Sneaky() {}

  @SuppressWarnings("unchecked")
  static <X extends Throwable> X sneak(Throwable t) throws X {
    throw (X) t;
  }
}
