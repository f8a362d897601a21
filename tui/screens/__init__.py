"""The app's screens: the race, help, modal dialogs, and the paced refresh they share."""
